// matvec_iq.wgsl's grid in workgroup memory: the storage home's table (bound at {{B_GRID}}, the same CONSTANT buffer)
// copied into shared memory by the workgroup's threads before the loop, so the loop's gathers (4-8 points a step and
// row, at data-dependent addresses spread over the whole table) hit shared memory's banks instead of going through the
// L1 cache line by line. Each workgroup pays one coalesced read of the table (GN vec2s: IQ3_XXS 1 KiB, IQ2_XXS and IQ3_S
// 2, IQ2_XS 4, IQ2_S 8, IQ1_S 16) and a barrier. lab/ops/matmul.py refuses it where table and reduction slots
// exceed the adapter's workgroup storage. Constants: B_GRID, GN (the table's vec2s).
@group(0) @binding({{B_GRID}}) var<storage, read> G: array<vec2<u32>>;

const GN: u32 = {{GN}}u;
var<workgroup> GS: array<vec2<u32>, GN>;

// Called by every thread in uniform control flow (accumulate's first statement).
fn grid_load(lid: u32) {
    for (var i = lid; i < GN; i += WG) {
        GS[i] = G[i];
    }
    workgroupBarrier();
}

fn gw8(p: u32) -> vec2<u32> { return GS[p]; }

fn gw4(p: u32) -> u32 { return GS[p >> 1u][p & 1u]; }
