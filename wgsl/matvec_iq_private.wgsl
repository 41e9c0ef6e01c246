// matvec_iq.wgsl's grid in quant.wgsl's private arrays, packed into codes of the grid's levels as the group loop reads
// them (lab/gpu/shaders.py says how, and why private); no binding. The form the storage home is measured against.
// Constants: GWORD (word i of the packed grid: one of the functions below, or quant.wgsl's iq2s_word / iq1s_word for
// the grids in parts), GLV (its levels, IQ2XXS_LEVELS ...). Its points' bytes are the level bytes packed back into
// words, as the other homes hold them (IQ1's levels are int8 bytes: the value file sign-extends them).
fn iq2xxs_word(i: u32) -> u32 { return IQ2XXS_GRID[i]; }
fn iq2xs_word(i: u32) -> u32 { return IQ2XS_GRID[i]; }
fn iq3xxs_word(i: u32) -> u32 { return IQ3XXS_GRID[i]; }
fn iq3s_word(i: u32) -> u32 { return IQ3S_GRID[i]; }

fn grid_load(lid: u32) {}

fn pack_bytes(v: vec4<u32>) -> u32 { return v.x | (v.y << 8u) | (v.z << 16u) | (v.w << 24u); }

fn gw8(p: u32) -> vec2<u32> {
    let h = grid_point({{GWORD}}(p >> 1u), p);
    return vec2<u32>(pack_bytes(grid_values(h, 0u, 2u, {{GLV}})), pack_bytes(grid_values(h, 8u, 2u, {{GLV}})));
}

fn gw4(p: u32) -> u32 { return pack_bytes(grid_values(grid_point({{GWORD}}(p >> 1u), p), 0u, 3u, {{GLV}})); }
