// Activations shared by the GLU kernel and the matvec's GLU prologue (one definition, so fused and
// unfused paths compute the same f32 values).

fn silu(g: f32) -> f32 {
    // exp(-g) overflows to +inf for g < -88: g / inf = -0, the right limit; no NaN.
    return g / (1.0 + exp(-g));
}

fn gelu_tanh(g: f32) -> f32 {
    // tanh's argument is clamped: tanh(+-10) is +-1 in f32 already, and some drivers' tanh returns NaN
    // for large |z| (computed as a ratio of exponentials that both overflow).
    let z = clamp(0.7978845608028654 * (g + 0.044715 * g * g * g), -10.0, 10.0);
    return 0.5 * g * (1.0 + tanh(z));
}
