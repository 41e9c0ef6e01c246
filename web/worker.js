// The module worker: boots Pyodide from this origin, installs the lab wheel, copies the WGSL sources
// into Pyodide's file system, then hands every message to Python (lab/worker.py).
// Pyodide refuses classic workers: this file is loaded with {type: "module"}.
import { loadPyodide } from "/pyodide/pyodide.mjs";

const pending = [];
let handle = null;
let pyodide = null;
let cancelLoad = false;
let stopGeneration = false;

// Messages Python cannot take while it is busy (a load or a generation in flight) are handled here.
self.onmessage = (e) => {
  const m = e.data;
  if (m.type === "cancel-load") cancelLoad = true;
  else if (m.type === "stop") stopGeneration = true;
  else if (m.type === "memory") postMessage({ type: "memory", wasm_heap: wasmHeap() });
  else if (handle) handle(m);
  else pending.push(m);
};
globalThis.labStopRequested = () => stopGeneration;
globalThis.labStopClear = () => { stopGeneration = false; };
const wasmHeap = () => (pyodide ? pyodide._module.HEAPU8.byteLength : 0);

// Streams weights from the File to GPU buffers: plan = [fileOffset, size, buffer, bufferOffset, ...]
// in file order, each piece at most `chunk` bytes. Consecutive pieces are read together, one
// File.slice of at most `chunk` bytes at a time, so host memory holds about one chunk whatever the
// model size, and nothing passes through wasm memory. Offsets stay JS numbers (exact past 2 GB).
// Returns the bytes moved, or -1 when cancelled.
globalThis.labUpload = async (device, file, plan, chunk) => {
  cancelLoad = false;
  const total = plan.reduce((acc, v, i) => (i % 4 === 1 ? acc + v : acc), 0);
  const heap0 = wasmHeap();
  let heapPeak = heap0, done = 0, i = 0;
  const t0 = performance.now();
  while (i < plan.length) {
    if (cancelLoad) return -1;
    const start = plan[i];
    let j = i, end = start;
    while (j < plan.length && plan[j] + plan[j + 1] - start <= chunk) { end = plan[j] + plan[j + 1]; j += 4; }
    if (j === i) throw new Error(`a piece of ${plan[i + 1]} bytes is larger than the ${chunk}-byte chunk`);
    const bytes = await file.slice(start, end).arrayBuffer();
    if (bytes.byteLength < end - start) {
      throw new Error(`the file ends inside the tensor data (${file.size} bytes, tensors reach ${end}): it is truncated`);
    }
    for (let k = i; k < j; k += 4) {
      const size = plan[k + 1];
      let data = new Uint8Array(bytes, plan[k] - start, size);
      if (size % 4) { const padded = new Uint8Array(size + 4 - (size % 4)); padded.set(data); data = padded; }
      device.queue.writeBuffer(plan[k + 2], plan[k + 3], data);
      done += size;
    }
    i = j;
    await device.queue.onSubmittedWorkDone();   // the queue's staging copies stay bounded by one chunk
    heapPeak = Math.max(heapPeak, wasmHeap());
    const s = (performance.now() - t0) / 1000;
    postMessage({ type: "load-progress", done, total, seconds: s, mb_s: done / 1e6 / Math.max(s, 1e-6),
                  eta_s: done ? (s * (total - done)) / done : null, wasm_heap_growth: heapPeak - heap0 });
  }
  return done;
};

// Encodes a prepared step in one call from Python: plan = [pipeline, group, x, y, z, ...];
// writes = [buffer, offset, Uint8Array, ...] applied first. One compute pass, one submit.
globalThis.labEncode = (device, plan, writes) => {
  if (writes) {
    for (let i = 0; i < writes.length; i += 3) device.queue.writeBuffer(writes[i], writes[i + 1], writes[i + 2]);
  }
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass();
  for (let i = 0; i < plan.length; i += 5) {
    pass.setPipeline(plan[i]);
    pass.setBindGroup(0, plan[i + 1]);
    pass.dispatchWorkgroups(plan[i + 2], plan[i + 3], plan[i + 4]);
  }
  pass.end();
  device.queue.submit([enc.finish()]);
};

async function fetchOk(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r;
}

async function boot() {
  const t0 = performance.now();
  postMessage({ type: "status", text: "loading Python (Pyodide)" });
  pyodide = await loadPyodide({ indexURL: "/pyodide/" });
  const version = await (await fetchOk("/version.json")).json();
  postMessage({ type: "status", text: "installing the lab package" });
  await pyodide.loadPackage(new URL(`/wheel/${version.wheel}`, self.location).href);
  const names = await (await fetchOk("/wgsl/index.json")).json();
  pyodide.FS.mkdirTree("/lab/wgsl");
  await Promise.all(names.map(async (n) => pyodide.FS.writeFile(`/lab/wgsl/${n}`, await (await fetchOk(`/wgsl/${n}`)).text())));
  pyodide.runPython("import lab.shaders; lab.shaders.set_dir('/lab/wgsl')");
  const worker = pyodide.pyimport("lab.worker");
  handle = (data) => worker.handle(data);
  postMessage({ type: "booted", ms: Math.round(performance.now() - t0), python: pyodide.version });
  for (const m of pending.splice(0)) handle(m);
}

boot().catch((e) => postMessage({ type: "error", where: "boot", message: String(e && e.message ? e.message : e) }));
