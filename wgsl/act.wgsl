// Activations shared by the GLU kernel and the matvec's GLU prologue (one definition, so fused and
// unfused paths compute the same f32 values), and SiLU's derivative, shared by the backward kernels.

fn silu(g: f32) -> f32 {
    // exp(-g) overflows to +inf for g < -88: g / inf = -0, the right limit; no NaN.
    return g / (1.0 + exp(-g));
}

// silu'(g) = s(g) (1 + g s(-g)), s = sigmoid (the backward kernels': backward_glu, backward_shortconv's silu mode,
// backward_deltanet's gated norm); s(-g) = 1 - s(g) computed with its own exp, so it keeps its relative precision
// where s(g) rounds to 1 (g > 17).
fn silu_grad(g: f32) -> f32 {
    // exp overflows to +inf past |g| = 88: s(g) = 0 and s(-g) = 1 there (or the reverse), never inf * 0.
    let s = 1.0 / (1.0 + exp(-g));
    let sm = 1.0 / (1.0 + exp(g));
    return s * (1.0 + g * sm);
}

fn gelu_tanh(g: f32) -> f32 {
    // tanh's argument is clamped: tanh(+-10) is +-1 in f32 already, and some drivers' tanh returns NaN
    // for large |z| (computed as a ratio of exponentials that both overflow).
    let z = clamp(0.7978845608028654 * (g + 0.044715 * g * g * g), -10.0, 10.0);
    return 0.5 * g * (1.0 + tanh(z));
}
