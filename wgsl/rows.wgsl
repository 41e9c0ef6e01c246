// Row selection of the row-wise kernels with a `rows` argument (softmax, argmax, top-k): included, no entry points.
// Bindings: none; the including kernel passes its uniform's mode and count and the step's n_tokens.
// Modes (Python owns the numbers: lab/ops/rows.py fills each constant below by its name):
//   ROWS_FIXED   rows 0..count-1, whatever the step
//   ROWS_TOKENS  one row per token of the step, at most count
//   ROWS_LAST    one row, the step's last token's: read from row n_tokens-1, handled as row 0
// Math: rows_in_step(mode, count, t) = rows the step has (workgroups for rows past it return at once);
//       row_read(mode, r, t) = the input row that row r reads.
// Constants: ROWS_FIXED, ROWS_TOKENS, ROWS_LAST (lab.ops.rows.WGSL).

const ROWS_FIXED: u32 = {{ROWS_FIXED}}u;
const ROWS_TOKENS: u32 = {{ROWS_TOKENS}}u;
const ROWS_LAST: u32 = {{ROWS_LAST}}u;

fn rows_in_step(mode: u32, count: u32, n_tokens: u32) -> u32 {
    if (mode == ROWS_TOKENS) { return min(n_tokens, count); }
    if (mode == ROWS_LAST) { return min(n_tokens, 1u); }
    return count;
}

fn row_read(mode: u32, r: u32, n_tokens: u32) -> u32 {
    if (mode == ROWS_LAST) { return n_tokens - 1u; }
    return r;
}
