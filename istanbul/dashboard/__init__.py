"""`istanbul dashboard`: a live web page of the training queue, its jobs and the services.

    cli.py                the command (flags; starts uvicorn)
    app.py                the Starlette app: page, JSON API, server-sent events, actions
    reader.py             what it shows, read from Redis as the daemon wrote it
    actions.py            cancel and re-queue
    checkpoints.py        a checkpoint's step, size and verification
    tokenizer_metrics.py  a tokenizer service's /metrics, summarised
    static/               the page, its script and style, uPlot (vendored, see its VERSION)

Needs the `dashboard` extra (pip install 'istanbul[dashboard]': starlette, uvicorn); nothing
here is imported until the command runs.
"""
