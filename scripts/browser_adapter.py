"""The WebGPU adapter a browser gives a page (vendor, architecture, every feature, the kernels' limits), for the
browser and flags `lab bench --backend browser` would use (LAB_CHROMIUM / LAB_CHROMIUM_FLAGS), once as they are
and once per extra flag given, e.g. a Dawn toggle:

    python3 scripts/browser_adapter.py "" --enable-dawn-features=vulkan_enable_f16_on_nvidia

One JSON line per run. The page is a blank one served from 127.0.0.1 (WebGPU needs a secure context). Where the
adapter has `chromium-experimental-subgroup-matrix`, each configuration it lists is compiled, checked against a CPU
product and timed (scripts/subgroup_matrix_probe.js), with a plain f32 FMA loop of the same shape for scale.
"""

from __future__ import annotations

import http.server
import json
import sys
import threading
from pathlib import Path

from lab.host.bench.browser import ADAPTER_JS, browser_command

SUBGROUP_MATRIX_JS = (Path(__file__).parent / "subgroup_matrix_probe.js").read_text()


def main(extras: list[str]) -> int:
    from playwright.sync_api import sync_playwright

    class Blank(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<!doctype html><title>adapter</title>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Blank)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/"
    with sync_playwright() as pw:
        for extra in extras or [""]:
            path, args = browser_command(extra=[extra] if extra else [])
            out = {"extra_flag": extra}
            try:
                b = pw.chromium.launch(executable_path=path, args=args)
                try:
                    page = b.new_page()
                    page.goto(url)
                    out["adapter"] = page.evaluate(ADAPTER_JS)
                    out["subgroup_matrix"] = page.evaluate(SUBGROUP_MATRIX_JS)
                    out["browser"] = b.version
                finally:
                    b.close()
            except Exception as exc:  # noqa: BLE001 -- one flag set failing says something too: report it, go on
                out["error"] = repr(exc)[:500]
            print(json.dumps(out), flush=True)
    srv.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
