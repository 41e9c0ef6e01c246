// The module worker: boots Pyodide from this origin, installs the lab wheel, copies the WGSL sources
// into Pyodide's file system, then hands every message to Python (lab/worker.py).
// Pyodide refuses classic workers: this file is loaded with {type: "module"}.
import { loadPyodide } from "/pyodide/pyodide.mjs";

const pending = [];
let handle = null;
self.onmessage = (e) => (handle ? handle(e.data) : pending.push(e.data));

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
  const pyodide = await loadPyodide({ indexURL: "/pyodide/" });
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
