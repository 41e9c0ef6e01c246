// matvec_iq.wgsl's grid in quant.wgsl's private arrays, packed into codes of the grid's levels as the group loop reads
// them (lab/gpu/shaders.py says how, and why private); no binding. The form the storage home is measured against.
// Constants: GWORD (word i of the packed grid: one of the functions below, or quant.wgsl's iq2s_word / iq1s_word for
// the grids in parts), GLV (its levels, IQ2XXS_LEVELS ...), GV (gv_u, or gv_i: IQ1's levels as int8).
fn iq2xxs_word(i: u32) -> u32 { return IQ2XXS_GRID[i]; }
fn iq2xs_word(i: u32) -> u32 { return IQ2XS_GRID[i]; }
fn iq3xxs_word(i: u32) -> u32 { return IQ3XXS_GRID[i]; }
fn iq3s_word(i: u32) -> u32 { return IQ3S_GRID[i]; }

fn gv_u(v: vec4<u32>) -> vec4<f32> { return vec4<f32>(v); }
fn gv_i(v: vec4<u32>) -> vec4<f32> { return vec4<f32>(bitcast<vec4<i32>>(v << vec4<u32>(24u)) >> vec4<u32>(24u)); }

fn g8(p: u32) -> Dq {
    let h = grid_point({{GWORD}}(p >> 1u), p);
    return Dq({{GV}}(grid_values(h, 0u, 2u, {{GLV}})), {{GV}}(grid_values(h, 8u, 2u, {{GLV}})));
}

fn g4(p: u32) -> vec4<f32> { return {{GV}}(grid_values(grid_point({{GWORD}}(p >> 1u), p), 0u, 3u, {{GLV}})); }
