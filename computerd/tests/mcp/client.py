"""An agent host's side of `computerd mcp`, for computerd/tests/mcp.rs: the official
Python MCP SDK (PyPI `mcp`, installed by scripts/install-test-deps.sh) starts the server
as a host would and drives every tool through it, asserting what a model would read.

    python client.py SCENARIO COMPUTERD ARGS...

SCENARIO is `tools` (every tool, exec on each backend, progress, cancellation; the
workspace is checked by the Rust test afterwards), `discover` (the 2026-07-28 protocol,
which has no handshake) or `timing:N` (N calls of each tool, latency per call printed
as JSON, for benches/mcp.py and docs/benchmarks.md).
"""
import asyncio
import json
import sys
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def text_of(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def call(session, name, arguments, expect_error=False, **kwargs) -> str:
    result = await session.call_tool(name, arguments, **kwargs)
    text = text_of(result)
    assert bool(result.is_error) == expect_error, f"{name} {arguments}: {result.is_error} {text}"
    return text


async def files(s) -> None:
    written = await call(s, "write", {"path": "src/app.py", "content": "a = 1\nb = 2\nb = 2\n"})
    assert written == "created /src/app.py (18 bytes)", written
    read = await call(s, "read", {"path": "/workspace/src/app.py"})
    assert read == "     1\ta = 1\n     2\tb = 2\n     3\tb = 2\n", read
    page = await call(s, "read", {"path": "src/app.py", "offset": 2, "limit": 1})
    assert page == "     2\tb = 2\n[lines 2 to 2 of 3 shown; read from line 3 for more]\n", page

    diff = await call(s, "edit", {"path": "src/app.py", "old_text": "a = 1", "new_text": "a = 10"})
    assert "-a = 1\n+a = 10\n" in diff, diff
    twice = await call(s, "edit", {"path": "src/app.py", "old_text": "b = 2", "new_text": "c"}, True)
    assert "appears 2 times" in twice, twice
    missing = await call(s, "edit", {"path": "src/app.py", "old_text": "zzz", "new_text": "c"}, True)
    assert "appears 0 times" in missing, missing
    nofile = await call(s, "read", {"path": "src/none.py"}, True)
    assert "/src/none.py" in nofile, nofile
    unknown = await call(s, "read", {"path": "a", "lines": 3}, True)
    assert "unknown field `lines`" in unknown, unknown

    hello = await call(s, "edit", {"path": "hello.txt", "old_text": "hello", "new_text": "hello, mcp"})
    assert "+hello, mcp\n" in hello, hello
    listed = await call(s, "ls", {})
    assert listed.splitlines() == ["hello.txt  11", "src/"], listed
    found = await call(s, "find", {"pattern": "**/*.py"})
    assert found == "/src/app.py\n", found
    grepped = await call(s, "grep", {"pattern": r"^b = \d", "include": "*.py"})
    assert grepped == "/src/app.py:2:b = 2\n/src/app.py:3:b = 2\n", grepped
    none = await call(s, "grep", {"pattern": "nothing here"})
    assert none == "[no line matches]\n", none


async def execs(s) -> None:
    linux = await call(s, "exec", {"command": "wc -l < src/app.py; echo made > from-linux.txt",
                                   "backend": "linux"})
    assert linux.startswith("exit 0 (completed) on linux (asked for by the caller) in "), linux
    assert "sync: complete" in linux and "--- stdout ---\n3\n" in linux, linux

    shell = await call(s, "exec", {"command": "cat from-linux.txt; echo shell > from-shell.txt",
                                   "backend": "shell"})
    assert shell.startswith("exit 0 (completed) on shell") and "made\n" in shell, shell

    module = ("import fs from 'fs';\n"
              "export default async ({ n }) => {\n"
              "  await fs.writeFile('from-js.txt', String(n * 2));\n"
              "  return { doubled: n * 2, shell: await fs.readFile('from-shell.txt', 'utf8') };\n"
              "};\n")
    js = await call(s, "exec", {"command": module, "backend": "js", "input": {"n": 21}})
    assert 'value: {"doubled":42,"shell":"shell\\n"}' in js, js

    auto = await call(s, "exec", {"command": "cat from-js.txt", "backend": "auto"})
    assert auto.startswith("exit 0 (completed) on shell (auto: shell can run every") and "--- stdout ---\n42" in auto, auto
    git = await call(s, "exec", {"command": "git --version >/dev/null && echo has-git",
                                 "backend": "auto"})
    assert " on linux (auto: escalated to linux (not shell: " in git and "has-git" in git, git

    failed = await call(s, "exec", {"command": "echo oops >&2; exit 3", "backend": "shell"})
    assert failed.startswith("exit 3 (failed)") and "--- stderr ---\noops\n" in failed, failed
    refused = await call(s, "exec", {"command": "true", "backend": "nope"}, True)
    assert "nope" in refused, refused
    stdin = await call(s, "exec", {"command": "tr a-z A-Z", "backend": "shell", "input": "quiet\n"})
    assert "--- stdout ---\nQUIET\n" in stdin, stdin


async def progress(s) -> None:
    seen = []

    async def on_progress(value, total, message):
        seen.append((value, message))

    script = "for i in 1 2 3; do echo line $i; sleep 0.2; done"
    answer = await call(s, "exec", {"command": script, "backend": "shell"},
                        progress_callback=on_progress)
    assert "--- stdout ---\nline 1\nline 2\nline 3\n" in answer, answer
    assert "".join(m for _, m in seen) == "line 1\nline 2\nline 3\n", seen
    assert [v for v, _ in seen] == sorted(v for v, _ in seen), seen


async def cancellation(s) -> None:
    """A host that gives up on a call (a timeout of its own) cancels it: the command
    is killed, not left running."""
    try:
        await s.call_tool("exec", {"command": "sleep 30; echo late > late.txt",
                                   "backend": "linux"},
                          read_timeout_seconds=__import__("datetime").timedelta(seconds=1))
        raise AssertionError("a 30 s command answered within 1 s")
    except AssertionError:
        raise
    except Exception:
        pass
    await asyncio.sleep(1.5)
    trail = await call(s, "exec", {"command": "test -e late.txt && echo exists || echo absent",
                                   "backend": "shell"})
    assert "absent" in trail, trail


async def tools_scenario(s) -> None:
    init = await s.initialize()
    assert init.server_info.name == "computerd", init
    listed = (await s.list_tools()).tools
    assert [t.name for t in listed] == ["read", "write", "edit", "ls", "find", "grep", "exec"]
    exec_tool = listed[-1]
    for backend in ("linux", "shell", "js", "auto"):
        assert f"`{backend}`" in exec_tool.description, exec_tool.description
    assert exec_tool.input_schema["required"] == ["command"], exec_tool.input_schema
    assert listed[0].annotations.read_only_hint is True
    await files(s)
    await execs(s)
    await progress(s)
    await cancellation(s)
    print("tools: ok")


async def discover_scenario(s) -> None:
    found = await s.discover()
    assert "2026-07-28" in found.supported_versions, found
    listed = (await s.list_tools()).tools
    assert len(listed) == 7, listed
    read = await call(s, "read", {"path": "hello.txt"})
    assert read == "     1\thello\n", read
    print("discover: ok")


THOUSAND_FILES = ("import fs from 'fs';\n"
                  "export default async () => {\n"
                  "  for (const name of await fs.readdir('many')) {\n"
                  "    const text = await fs.readFile(`many/${name}`, 'utf8');\n"
                  "    await fs.writeFile(`many/${name}`, text + '.');\n"
                  "  }\n"
                  "  return 1000;\n"
                  "};\n")


async def timing_scenario(s, rounds: int) -> None:
    """Each call `rounds` times in turn: the first call of each (the first of its kind in
    the session, and for an exec backend possibly in the daemon's life), then the
    median and the minimum, ms, as seen by the client (JSON-RPC over stdio, the MCP
    process, the owner's channel, the work)."""
    await s.initialize()
    await call(s, "write", {"path": "bench/file.txt", "content": "x = 1\n" * 100})
    await call(s, "write", {"path": "bench/out.txt", "content": "hello\n"})
    await call(s, "exec", {"command": "mkdir many && for i in $(seq 1000); do echo $i > many/f$i; done",
                           "backend": "shell"})
    calls = {
        "read (100 lines)": lambda i: ("read", {"path": "bench/file.txt"}),
        "write (6 bytes)": lambda i: ("write", {"path": "bench/out.txt", "content": "hello\n"}),
        # The write before it in each round puts "hello" back.
        "edit": lambda i: ("edit", {"path": "bench/out.txt", "old_text": "hello",
                                    "new_text": "HELLO"}),
        "ls (1,000 entries)": lambda i: ("ls", {"path": "many"}),
        "find **/*.txt": lambda i: ("find", {"pattern": "**/*.txt"}),
        "grep (one file)": lambda i: ("grep", {"pattern": "x = 1", "path": "bench/file.txt"}),
        "exec shell: cat": lambda i: ("exec", {"command": "cat bench/out.txt", "backend": "shell"}),
        "exec linux: cat": lambda i: ("exec", {"command": "cat bench/out.txt", "backend": "linux"}),
        "exec js: trivial module": lambda i: ("exec", {"command": "export default () => 1",
                                                       "backend": "js"}),
        "exec js: read and rewrite 1,000 files": lambda i: ("exec", {"command": THOUSAND_FILES,
                                                                     "backend": "js"}),
    }
    baseline = "tools/list (no call to the owner)"
    samples = {label: [] for label in [baseline, *calls]}
    for i in range(rounds):
        started = time.perf_counter()
        await s.list_tools()
        samples[baseline].append((time.perf_counter() - started) * 1000)
        for label, make in calls.items():
            started = time.perf_counter()
            await call(s, *make(i))
            samples[label].append((time.perf_counter() - started) * 1000)
    report = {}
    for label, taken in samples.items():
        first = taken[0]
        taken.sort()
        report[label] = {"first_ms": first, "median_ms": taken[len(taken) // 2],
                         "min_ms": taken[0]}
    print(json.dumps(report))


async def main() -> None:
    scenario, server, *args = sys.argv[1:]
    params = StdioServerParameters(command=server, args=args)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            if scenario == "tools":
                await tools_scenario(session)
            elif scenario == "discover":
                await discover_scenario(session)
            elif scenario.startswith("timing"):
                await timing_scenario(session, int(scenario.split(":")[1]))
            else:
                raise SystemExit(f"unknown scenario {scenario}")


asyncio.run(main())
