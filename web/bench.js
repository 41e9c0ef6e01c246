// Page-side recorder for `lab bench --backend browser` (lab/host/bench/browser.py), which injects this file as an
// init script, so it runs before main.js. It records the worker's messages as the page receives them and gives
// the benchmark a way to post to the worker directly; the page itself is untouched. The page never loads it.
(() => {
  const seen = window.__labBench = {
    messages: [],          // every worker message but `token` (counted) and `load-progress` (too many)
    tokens: 0,
    worker: null,
    since: (n) => seen.messages.slice(n),
    // whether a message of this type, or an error, arrived at index n or later
    arrived: (kind, n) => seen.since(n).some((m) => m.type === kind || m.type === "error"),
    post: (m) => seen.worker.postMessage(m),
  };
  const Native = window.Worker;
  window.Worker = class extends Native {
    constructor(...args) {
      super(...args);
      seen.worker = this;
      // The page loads with the engine's default KV cache; a benchmark of decode at a long context asks for more,
      // a benchmark of the tensor-core prefill sets the load's int8 flag, and one of the f16 cache its kv type.
      const post = this.postMessage.bind(this);
      this.postMessage = (m, ...rest) => {
        if (m && m.type === "load" && window.__labBenchCtx) m = { ...m, n_ctx: window.__labBenchCtx };
        if (m && m.type === "load" && window.__labBenchInt8) m = { ...m, int8: true };
        if (m && m.type === "load" && window.__labBenchKv) m = { ...m, kv: window.__labBenchKv };
        return post(m, ...rest);
      };
      this.addEventListener("message", (e) => {
        const m = e.data;
        if (m.type === "token") seen.tokens++;
        else if (m.type !== "load-progress") seen.messages.push(m);
      });
    }
  };
})();
