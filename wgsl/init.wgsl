// A model's first weights, drawn on the GPU (lab/ops/init.py; issue #44, a model trained from scratch): each
// element of a tensor from N(mean, std^2) by its own index, so a tensor split across buffers, or filled in any order,
// gets the same values, and the bytes never pass through the host (a 16M-parameter model is 64 MB of f32).
//
// normal: w[dst + i] = mean + std * z(key, first + i) for i < p.n, where z is a standard normal by Box-Muller from two
//   uniforms, each from 23 bits of a hash of (key, element index):
//     u1 = ((hash(key, 2 e) >> 9) + 0.5) / 2^23,  u2 = ((hash(key, 2 e + 1) >> 9) + 0.5) / 2^23   (both in (0, 1))
//     z  = sqrt(-2 ln u1) * cos(2 pi u2) = -sqrt(-2 ln u1) * cos(2 pi u2 - pi)
//   (23 bits and the half: 24 significant bits, so each uniform is exact in f32; cos's argument brought into
//   [-pi, pi], where WGSL bounds its error: 2^-11 absolute, far looser than any adapter measured.)
//   hash(key, j) = pcg(pcg(key) ^ j) with pcg the PCG hash of Jarzynski and Olano ("Hash Functions for GPU
//   Rendering", 2020); key = lab.ops.init.key(seed, stream): one stream per tensor. The uniforms are exact in f32 and
//   the same on every adapter; z carries ln's, sqrt's and cos's rounding (a few ulp, adapter-dependent), so one seed
//   gives one start on one adapter and starts within ~1e-6 of each other across adapters. |z| < 5.8 (u1 >= 2^-24).
//   std = 0 is a constant fill (a norm's ones).
// Grid: 1-D over elements, folded into y past 65535 groups: i = gid.x + gid.y * (nwg.x * WG).
// Init { n, key, first, dst: u32, mean, sd: f32, _p0, _p1: u32 }  (dst: the run's first float in the bound buffer,
//   any float: a tensor inside a stacked weight starts where its neighbour ends)
// Constants (lab.ops.init): WG.

struct Init { n: u32, key: u32, first: u32, dst: u32, mean: f32, sd: f32, _p0: u32, _p1: u32 };

const WG: u32 = {{WG}}u;
const TWO_PI: f32 = 6.2831853071795864;
const PI: f32 = 3.1415926535897932;

@group(0) @binding(0) var<storage, read_write> w: array<f32>;
@group(0) @binding(1) var<uniform> p: Init;

fn pcg(v: u32) -> u32 {
    let state = v * 747796405u + 2891336453u;
    let word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
    return (word >> 22u) ^ word;
}

fn uniform01(j: u32) -> f32 {
    return (f32(pcg(pcg(p.key) ^ j) >> 9u) + 0.5) * (1.0 / 8388608.0);
}

@compute @workgroup_size(WG)
fn normal(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * (nwg.x * WG);
    if (i >= p.n) { return; }
    let e = p.first + i;
    let u1 = uniform01(2u * e);
    let u2 = uniform01(2u * e + 1u);
    let z = -sqrt(-2.0 * log(u1)) * cos(TWO_PI * u2 - PI);
    w[p.dst + i] = p.mean + p.sd * z;
}
