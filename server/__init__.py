"""The asset server: serves the page, web/ assets, the self-hosted Pyodide core, the `lab` wheel, the
WGSL sources and the default model. It never runs inference and never receives conversation data:
GET and HEAD only, no request bodies, no query strings in its log."""
