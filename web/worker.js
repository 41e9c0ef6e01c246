// The module worker: boots Pyodide from this origin, installs the lab wheel, copies the WGSL sources
// into Pyodide's file system, then hands every message to Python (lab/worker/router.py).
// Pyodide refuses classic workers: this file is loaded with {type: "module"}.
import { loadPyodide } from "/pyodide/pyodide.mjs";

const pending = [];
let handle = null;
let pyodide = null;
let lastLoad = 0;         // seq of the newest "load" message received
let cancelledUpTo = 0;    // loads with a seq up to this one stop at their next chunk
let stopGeneration = false;

// Messages Python cannot take while it is busy (a load or a generation in flight) are handled here.
self.onmessage = (e) => {
  const m = e.data;
  if (m.type === "cancel-load") cancelledUpTo = lastLoad;   // every load asked for so far, not one asked later
  else if (m.type === "stop") stopGeneration = true;
  else if (m.type === "memory") postMessage({ type: "memory", wasm_heap: wasmHeap(), calls: snapshotCalls() });
  else if (m.type === "count-calls") countCalls();
  else if (m.type === "load") { lastLoad = m.seq; handle ? handle(m) : pending.push(m); }
  else if (handle) handle(m);
  else pending.push(m);
};
globalThis.labStopRequested = () => stopGeneration;
globalThis.labStopClear = () => { stopGeneration = false; };
const wasmHeap = () => (pyodide ? pyodide._module.HEAPU8.byteLength : 0);

// Streams weights from the File to GPU buffers: pieces = [{fileOffset, size, buffer, bufferOffset}, ...]
// (lab.ops.weights.Upload) in file order, each at most `chunk` bytes. Consecutive pieces are read together, one
// File.slice of at most `chunk` bytes at a time, so host memory holds about one chunk whatever the
// model size, and nothing passes through wasm memory. Offsets stay JS numbers (exact past 2 GB).
// Returns the bytes moved, or -1 when cancelled (the cancel button, or another file picked: `seq` is the load's).
globalThis.labUpload = async (device, file, pieces, chunk, seq) => {
  const total = pieces.reduce((acc, p) => acc + p.size, 0);
  const heap0 = wasmHeap();
  let heapPeak = heap0, done = 0, i = 0;
  const t0 = performance.now();
  while (i < pieces.length) {
    if (seq <= cancelledUpTo) return -1;
    const start = pieces[i].fileOffset;
    let j = i, end = start;
    while (j < pieces.length && pieces[j].fileOffset + pieces[j].size - start <= chunk) {
      end = pieces[j].fileOffset + pieces[j].size;
      j += 1;
    }
    if (j === i) throw new Error(`a piece of ${pieces[i].size} bytes is larger than the ${chunk}-byte chunk`);
    const bytes = await file.slice(start, end).arrayBuffer();
    if (bytes.byteLength < end - start) {
      throw new Error(`the file ends inside the tensor data (${file.size} bytes, tensors reach ${end}): it is truncated`);
    }
    for (let k = i; k < j; k += 1) {
      const { fileOffset, size, buffer, bufferOffset } = pieces[k];
      let data = new Uint8Array(bytes, fileOffset - start, size);
      if (size % 4) { const padded = new Uint8Array(size + 4 - (size % 4)); padded.set(data); data = padded; }
      device.queue.writeBuffer(buffer, bufferOffset, data);
      done += size;
    }
    i = j;
    await device.queue.onSubmittedWorkDone();   // the queue's staging copies stay bounded by one chunk
    heapPeak = Math.max(heapPeak, wasmHeap());
    const s = (performance.now() - t0) / 1000;
    postMessage({ type: "load-progress", seq, done, total, seconds: s, mb_s: done / 1e6 / Math.max(s, 1e-6),
                  eta_s: done ? (s * (total - done)) / done : null, wasm_heap_growth: heapPeak - heap0 });
  }
  return done;
};

// Encodes a prepared step in one call from Python: dispatches = [pipeline, group, x, y, z, ...] (lab/gpu/browser.py
// prepare); writes = [buffer, offset, Uint8Array, ...] applied first. One compute pass, one submit.
const encodeStep = (device, dispatches, writes, passDescriptor) => {
  if (writes) {
    for (let i = 0; i < writes.length; i += 3) device.queue.writeBuffer(writes[i], writes[i + 1], writes[i + 2]);
  }
  const enc = device.createCommandEncoder();
  const pass = enc.beginComputePass(passDescriptor);
  for (let i = 0; i < dispatches.length; i += 5) {
    pass.setPipeline(dispatches[i]);
    pass.setBindGroup(0, dispatches[i + 1]);
    pass.dispatchWorkgroups(dispatches[i + 2], dispatches[i + 3], dispatches[i + 4]);
  }
  pass.end();
  return enc;
};
globalThis.labEncode = (device, dispatches, writes, copies) => {
  const enc = encodeStep(device, dispatches, writes);
  if (copies) {
    for (let i = 0; i < copies.length; i += 5) enc.copyBufferToBuffer(copies[i], copies[i + 1], copies[i + 2], copies[i + 3], copies[i + 4]);
  }
  device.queue.submit([enc.finish()]);
};

// The GPU's nanoseconds for one such pass, by timestamp queries (benchmarks only: lab/instruments/profile.py). The query set
// and its two buffers hold timestamps, never conversation data, so they live here, outside the buffer registry.
// Chromium rounds timestamps to 100 us unless started with --enable-webgpu-developer-features.
let timer = null;
globalThis.labTimePass = async (device, dispatches, writes) => {
  if (!timer || timer.device !== device) {
    timer = { device, queries: device.createQuerySet({ type: "timestamp", count: 2 }),
              resolved: device.createBuffer({ size: 16, usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC }),
              read: device.createBuffer({ size: 16, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST }) };
  }
  const enc = encodeStep(device, dispatches, writes, {
    timestampWrites: { querySet: timer.queries, beginningOfPassWriteIndex: 0, endOfPassWriteIndex: 1 } });
  enc.resolveQuerySet(timer.queries, 0, 2, timer.resolved, 0);
  enc.copyBufferToBuffer(timer.resolved, 0, timer.read, 0, 16);
  device.queue.submit([enc.finish()]);
  await timer.read.mapAsync(GPUMapMode.READ);
  const t = new BigUint64Array(timer.read.getMappedRange().slice(0));
  timer.read.unmap();
  return Number(t[1] - t[0]);
};

// Call counters for `lab bench --backend browser` (lab/host/bench/browser.py); nothing is wrapped until the first
// `count-calls` message, so the page pays nothing otherwise. Every call of a WebGPU method, of a lab* helper
// and of postMessage is counted, under `python` when Python made it through pyodide.ffi, under `js` when a
// helper's own JS did (labEncode's dispatches). Promise-returning methods also sum the milliseconds until
// they settle (mapAsync: the wait for the GPU). A snapshot is kept at each `token` message, so a decode
// step's calls are the difference between two consecutive snapshots.
let calls = null;      // {python: {name: n}, js: {name: n}, wait_ms: {name: ms}, marks: [snapshot at each token]}
let inHelper = 0;      // > 0 while a lab* helper runs: the GPU calls it makes are its own, not Python's
let wrapped = false;

const counts = () => ({ python: { ...calls.python }, js: { ...calls.js }, wait_ms: { ...calls.wait_ms },
                        ms: performance.now() });
const snapshotCalls = () => calls && { ...counts(), marks: calls.marks };

function countCalls() {
  calls = { python: {}, js: {}, wait_ms: {}, marks: [] };
  if (wrapped) return;
  wrapped = true;
  const tally = (name) => { const side = inHelper ? calls.js : calls.python; side[name] = (side[name] || 0) + 1; };
  const timed = (name, result) => {
    if (!(result instanceof Promise)) return result;
    const t0 = performance.now();
    const add = () => { if (calls) calls.wait_ms[name] = (calls.wait_ms[name] || 0) + performance.now() - t0; };
    result.then(add, add);
    return result;
  };
  for (const cls of [GPUDevice, GPUQueue, GPUBuffer, GPUCommandEncoder, GPUComputePassEncoder]) {
    for (const [key, d] of Object.entries(Object.getOwnPropertyDescriptors(cls.prototype))) {
      if (typeof d.value !== "function" || key === "constructor") continue;
      const f = d.value, name = `${cls.name}.${key}`;
      cls.prototype[key] = function (...a) { if (calls) tally(name); return timed(name, f.apply(this, a)); };
    }
  }
  for (const key of ["labEncode", "labStopRequested", "labStopClear"]) {
    const f = globalThis[key];
    globalThis[key] = (...a) => {
      if (calls) tally(key);
      inHelper++;
      try { return f(...a); } finally { inHelper--; }
    };
  }
  const post = globalThis.postMessage;
  globalThis.postMessage = (m, ...rest) => {
    if (calls && !inHelper) {
      tally("postMessage");
      if (m && m.type === "token") calls.marks.push(counts());
    }
    return post(m, ...rest);
  };
}

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
  pyodide.runPython("import lab.gpu.shaders; lab.gpu.shaders.set_dir('/lab/wgsl')");
  const worker = pyodide.pyimport("lab.worker.router");
  handle = (data) => worker.handle(data);
  postMessage({ type: "booted", ms: Math.round(performance.now() - t0), python: pyodide.version });
  for (const m of pending.splice(0)) handle(m);
}

boot().catch((e) => postMessage({ type: "error", where: "boot", message: String(e && e.message ? e.message : e) }));
