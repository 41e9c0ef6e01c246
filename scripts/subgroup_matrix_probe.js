async () => {
  // Every subgroup-matrix configuration the adapter lists: compiled, checked against a CPU product, and timed.
  const a = await navigator.gpu?.requestAdapter({powerPreference: 'high-performance'});
  if (!a) return {error: 'no adapter'};
  const F = 'chromium-experimental-subgroup-matrix';
  const configs = [...(a.info.subgroupMatrixConfigs ?? [])].map(c => ({
    componentType: c.componentType, resultComponentType: c.resultComponentType,
    M: Number(c.M), N: Number(c.N), K: Number(c.K)}));
  const out = {feature: a.features.has(F), shader_f16: a.features.has('shader-f16'), configs, runs: []};
  if (!out.feature) return out;
  const req = [F, ...(out.shader_f16 ? ['shader-f16'] : [])];
  const dev = await a.requestDevice({requiredFeatures: req});
  const sgSize = a.info.subgroupMaxSize || 32;
  // WGSL storage element for a component type: 8-bit types pack four to a u32/i32 word.
  const elem = t => ({f32: 'f32', f16: 'f16', u32: 'u32', i32: 'i32', u8: 'u32', i8: 'i32'})[t];
  const bytes = t => ({f32: 4, f16: 2, u32: 4, i32: 4, u8: 1, i8: 1})[t];
  const rnd = (t, n) => {   // small integers, exact in every type
    const v = new Array(n);
    for (let i = 0; i < n; i++) v[i] = ((i * 7 + 3) % 5) - (t === 'u8' || t === 'u32' ? 0 : 2);
    return v;
  };
  const pack = (t, v) => {
    if (t === 'f32') return new Float32Array(v).buffer;
    if (t === 'u32') return new Uint32Array(v).buffer;
    if (t === 'i32') return new Int32Array(v).buffer;
    if (t === 'f16') { const h = new Uint16Array(v.length);
      for (let i = 0; i < v.length; i++) { const x = v[i]; // small integers: exact halves
        if (x === 0) { h[i] = 0; continue; }
        const s = x < 0 ? 0x8000 : 0, ax = Math.abs(x), e = Math.floor(Math.log2(ax));
        h[i] = s | ((e + 15) << 10) | Math.round((ax / 2 ** e - 1) * 1024); }
      return h.buffer; }
    const b = t === 'u8' ? new Uint8Array(v.length) : new Int8Array(v.length);
    b.set(v); return b.buffer;
  };
  for (const c of configs) {
    const run = {...c};
    out.runs.push(run);
    try {
      if ((c.componentType === 'f16' || c.resultComponentType === 'f16') && !out.shader_f16) {
        run.skipped = 'needs shader-f16, which this adapter does not offer'; continue; }
      const ct = c.componentType, rt = c.resultComponentType, {M, N, K} = c;
      const en = 'enable chromium_experimental_subgroup_matrix;\n' + (out.shader_f16 ? 'enable f16;\n' : '');
      const L = `subgroup_matrix_left<${ct}, ${K}, ${M}>`, R = `subgroup_matrix_right<${ct}, ${N}, ${K}>`;
      const A = `subgroup_matrix_result<${rt}, ${N}, ${M}>`;
      const kstride = bytes(ct) === 1 ? K : K, nstride = N;
      const src = en + `
@group(0) @binding(0) var<storage, read> a: array<${elem(ct)}>;
@group(0) @binding(1) var<storage, read> b: array<${elem(ct)}>;
@group(0) @binding(2) var<storage, read_write> c: array<${elem(rt)}>;
const ITERS: u32 = ITERSu;
@compute @workgroup_size(${sgSize})
fn main(@builtin(workgroup_id) wid: vec3<u32>) {
  let l = subgroupMatrixLoad<${L}>(&a, 0, false, ${kstride});
  let r = subgroupMatrixLoad<${R}>(&b, 0, false, ${nstride});
  var x0 = ${A}(); var x1 = ${A}(); var x2 = ${A}(); var x3 = ${A}();
  for (var i = 0u; i < ITERS; i++) {
    x0 = subgroupMatrixMultiplyAccumulate(l, r, x0); x1 = subgroupMatrixMultiplyAccumulate(l, r, x1);
    x2 = subgroupMatrixMultiplyAccumulate(l, r, x2); x3 = subgroupMatrixMultiplyAccumulate(l, r, x3);
  }
  if (wid.x == 0u) { subgroupMatrixStore(&c, 0, x0, false, ${N}); }
  else if (wid.x == 9999999u) { subgroupMatrixStore(&c, 0, x1, false, ${N}); subgroupMatrixStore(&c, 0, x2, false, ${N});
                               subgroupMatrixStore(&c, 0, x3, false, ${N}); }
}`;
      const av = rnd(ct, M * K), bv = rnd(ct, K * N).map((x, i) => ((i * 3 + 1) % 4) - (ct === 'u8' || ct === 'u32' ? 0 : 1));
      const mk = (data, usage) => { const buf = dev.createBuffer({size: Math.max(16, data.byteLength), usage});
        dev.queue.writeBuffer(buf, 0, data); return buf; };
      const S = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
      const ba = mk(pack(ct, av), S), bb = mk(pack(ct, bv), S);
      const cbytes = M * N * bytes(rt);
      const bc = dev.createBuffer({size: Math.max(16, cbytes), usage: S});
      const rd = dev.createBuffer({size: Math.max(16, cbytes), usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
      const time = async (iters, groups) => {
        dev.pushErrorScope('validation');
        const mod = dev.createShaderModule({code: src.replace('ITERSu', iters + 'u')});
        const info = await mod.getCompilationInfo();
        const errs = info.messages.filter(m => m.type === 'error').map(m => m.message);
        if (errs.length) throw new Error('compile: ' + errs.join('; ').slice(0, 400));
        const pipe = await dev.createComputePipelineAsync({layout: 'auto', compute: {module: mod, entryPoint: 'main'}});
        const bg = dev.createBindGroup({layout: pipe.getBindGroupLayout(0), entries: [ba, bb, bc].map((buffer, binding) => ({binding, resource: {buffer}}))});
        const run1 = async () => {
          const enc = dev.createCommandEncoder(); const p = enc.beginComputePass();
          p.setPipeline(pipe); p.setBindGroup(0, bg); p.dispatchWorkgroups(groups); p.end();
          const t0 = performance.now(); dev.queue.submit([enc.finish()]); await dev.queue.onSubmittedWorkDone();
          return performance.now() - t0; };
        await run1();
        const ms = Math.min(await run1(), await run1(), await run1());
        const e = await dev.popErrorScope(); if (e) throw new Error('validation: ' + e.message);
        return ms;
      };
      await time(1, 1);     // one product: checked against the CPU
      const enc = dev.createCommandEncoder(); enc.copyBufferToBuffer(bc, 0, rd, 0, Math.max(16, cbytes));
      dev.queue.submit([enc.finish()]); await rd.mapAsync(GPUMapMode.READ);
      const raw = rd.getMappedRange().slice(0); rd.unmap();
      let got;
      if (rt === 'f32') got = [...new Float32Array(raw)];
      else if (rt === 'i32') got = [...new Int32Array(raw)];
      else if (rt === 'u32') got = [...new Uint32Array(raw)];
      else if (rt === 'f16') { const h = new Uint16Array(raw); got = [...h].map(x => { const s = x & 0x8000 ? -1 : 1,
        e = (x >> 10) & 31, m = x & 1023; return e === 0 ? s * m * 2 ** -24 : s * (1 + m / 1024) * 2 ** (e - 15); }); }
      else got = [...(rt === 'u8' ? new Uint8Array(raw) : new Int8Array(raw))];
      let bad = 0, first = null;
      for (let i = 0; i < M; i++) for (let j = 0; j < N; j++) {
        let s = 0; for (let k = 0; k < K; k++) s += av[i * K + k] * bv[k * N + j];
        if (got[i * N + j] !== s) { bad++; if (first === null) first = [i, j, got[i * N + j], s]; } }
      run.mismatches = bad; run.first_mismatch = first;
      const iters = 4096, groups = 2048;
      const ms = await time(iters, groups);
      run.ms = +ms.toFixed(3);
      run.tops = +(2 * M * N * K * 4 * iters * groups / (ms * 1e-3) / 1e12).toFixed(2);   // tera-ops a second
    } catch (e) { run.error = String(e).slice(0, 500); }
  }
  // the same loop shape on plain f32 FMAs (vec4, 4 chains), for scale
  try {
    const src = `@group(0) @binding(0) var<storage, read_write> c: array<vec4<f32>>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  var x0 = vec4<f32>(f32(g.x)); var x1 = x0 + 1.0; var x2 = x0 + 2.0; var x3 = x0 + 3.0;
  let m = vec4<f32>(0.999); let k = vec4<f32>(0.001);
  for (var i = 0u; i < 4096u; i++) { x0 = fma(x0, m, k); x1 = fma(x1, m, k); x2 = fma(x2, m, k); x3 = fma(x3, m, k); }
  if (g.x == 0xffffffffu) { c[0] = x0 + x1 + x2 + x3; } }`;
    const buf = dev.createBuffer({size: 16, usage: GPUBufferUsage.STORAGE});
    const pipe = await dev.createComputePipelineAsync({layout: 'auto', compute: {module: dev.createShaderModule({code: src}), entryPoint: 'main'}});
    const bg = dev.createBindGroup({layout: pipe.getBindGroupLayout(0), entries: [{binding: 0, resource: {buffer: buf}}]});
    const groups = 8192, run1 = async () => { const enc = dev.createCommandEncoder(); const p = enc.beginComputePass();
      p.setPipeline(pipe); p.setBindGroup(0, bg); p.dispatchWorkgroups(groups); p.end();
      const t0 = performance.now(); dev.queue.submit([enc.finish()]); await dev.queue.onSubmittedWorkDone(); return performance.now() - t0; };
    await run1(); const ms = Math.min(await run1(), await run1(), await run1());
    out.f32_fma = {ms: +ms.toFixed(3), tflops: +(2 * 4 * 4 * 4096 * 64 * groups / (ms * 1e-3) / 1e12).toFixed(2)};
  } catch (e) { out.f32_fma = {error: String(e).slice(0, 300)}; }
  dev.destroy();
  return out;
}
