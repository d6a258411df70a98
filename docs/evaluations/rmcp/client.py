"""Drive the rmcp probe server over stdio with the Python `mcp` SDK (PyPI `mcp`).

    python3 -m venv /tmp/eval18/venv && /tmp/eval18/venv/bin/pip install mcp
    /tmp/eval18/venv/bin/python docs/evaluations/rmcp/client.py /tmp/eval18/target/debug/rmcp-probe

Runs twice: once with the legacy `initialize` handshake, once with `server/discover`
(protocol 2026-07-28, no handshake). Each lists tools, calls `echo`, and calls `slow`
with a progress callback (the SDK puts `_meta.progressToken` on the request).
"""
import asyncio
import sys
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def session_run(server: str, mode: str) -> None:
    params = StdioServerParameters(command=server, args=[])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            if mode == "initialize":
                r = await s.initialize()
                print(f"[{mode}] protocolVersion={r.protocol_version} server={r.server_info.name} {r.server_info.version}")
            else:
                r = await s.discover()
                print(f"[{mode}] supportedVersions={r.supported_versions}")
            tools = await s.list_tools()
            print(f"[{mode}] tools: {[t.name for t in tools.tools]}")
            print(f"[{mode}] echo schema: {tools.tools[0].input_schema}")
            r = await s.call_tool("echo", {"text": "hi ", "times": 3})
            print(f"[{mode}] echo -> isError={r.is_error} content={[c.text for c in r.content]}")
            r = await s.call_tool("echo", {"times": 3})
            print(f"[{mode}] echo without text -> isError={r.is_error} content={[getattr(c, 'text', c) for c in r.content]}")
            t0 = time.monotonic()

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                print(f"[{mode}]   progress {progress}/{total} {message!r} at {time.monotonic() - t0:.2f}s")

            r = await s.call_tool("slow", {"steps": 3}, progress_callback=on_progress)
            print(f"[{mode}] slow -> isError={r.is_error} structured={r.structured_content} after {time.monotonic() - t0:.2f}s")


async def main() -> None:
    server = sys.argv[1]
    for mode in ("initialize", "discover"):
        try:
            await session_run(server, mode)
        except Exception as e:  # report, keep going
            print(f"[{mode}] FAILED: {type(e).__name__}: {e}")


asyncio.run(main())
