//! Probe for docs/evaluations/rquickjs/README.md: each numbered section proves one claim of
//! the README against rquickjs 0.14.0 (QuickJS-NG 0.16.2). Prints a plain-text report.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use rquickjs::loader::{ImportAttributes, Loader, Resolver};
use rquickjs::module::{Declarations, Exports, ModuleDef};
use rquickjs::prelude::*;
use rquickjs::{
    AsyncContext, AsyncRuntime, Context, Ctx, Error, Exception,
    Function, Module, Object, Persistent, Promise, Runtime, TypedArray, Value,
};

// ---------------------------------------------------------------- host state

/// Stands in for the workspace: path -> bytes. Modules and `fs` both read it.
type Files = Rc<RefCell<BTreeMap<String, Vec<u8>>>>;

/// Stored in the runtime's userdata so the static `ModuleDef` can reach the host files.
struct FsHost(Files);
unsafe impl<'js> JsLifetime<'js> for FsHost {
    type Changed<'to> = FsHost;
}

#[derive(Debug, Clone)]
struct Event {
    at_us: u128,
    level: String,
    text: String,
}

/// What a run's console writes to: events plus a byte budget.
#[derive(Clone)]
struct Console {
    start: Instant,
    events: Rc<RefCell<Vec<Event>>>,
    bytes: Rc<Cell<usize>>,
    max_bytes: usize,
    /// Set when the output budget is exceeded; the interrupt handler then stops the script.
    over_budget: Rc<Cell<bool>>,
    echo: bool,
}

fn files_of(pairs: &[(&str, &str)]) -> Files {
    Rc::new(RefCell::new(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect(),
    ))
}

// ---------------------------------------------------------------- (2) resolver + loader

struct WsResolver {
    allow: Vec<&'static str>,
}

/// `base` is the importing module's name (an absolute workspace path like `/main.js`).
fn join(base: &str, rel: &str) -> Option<String> {
    let mut parts: Vec<&str> = if rel.starts_with('/') {
        vec![]
    } else {
        let dir = &base[..base.rfind('/').unwrap_or(0)];
        dir.split('/').filter(|s| !s.is_empty()).collect()
    };
    for seg in rel.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop()?; // refuse to climb above the workspace root
            }
            s => parts.push(s),
        }
    }
    Some(format!("/{}", parts.join("/")))
}

impl Resolver for WsResolver {
    fn resolve<'js>(
        &mut self,
        _ctx: &Ctx<'js>,
        base: &str,
        name: &str,
        _attributes: Option<ImportAttributes<'js>>,
    ) -> rquickjs::Result<String> {
        if name.starts_with("./") || name.starts_with("../") || name.starts_with('/') {
            join(base, name).ok_or_else(|| {
                Error::new_resolving_message(base, name, "path escapes the workspace root")
            })
        } else if self.allow.contains(&name) {
            Ok(name.to_string())
        } else {
            Err(Error::new_resolving_message(
                base,
                name,
                format!("bare import not allowed (allowed: {})", self.allow.join(", ")),
            ))
        }
    }
}

struct WsLoader {
    files: Files,
}

impl Loader for WsLoader {
    fn load<'js>(
        &mut self,
        ctx: &Ctx<'js>,
        name: &str,
        _attributes: Option<ImportAttributes<'js>>,
    ) -> rquickjs::Result<Module<'js>> {
        if name == "fs" {
            return Module::declare_def::<FsModule, _>(ctx.clone(), "fs");
        }
        let src = self
            .files
            .borrow()
            .get(name)
            .cloned()
            .ok_or_else(|| Error::new_loading_message(name, "no such module in the workspace"))?;
        Module::declare(ctx.clone(), name, src)
    }
}

// ---------------------------------------------------------------- (3) native `fs` module

/// A Node-like error object: `Error` with `code`, `syscall`, `path`.
fn node_error<'js>(ctx: &Ctx<'js>, code: &str, syscall: &str, path: &str) -> rquickjs::Result<Value<'js>> {
    let msg = format!("{code}: no such file or directory, {syscall} '{path}'");
    let e = Exception::from_message(ctx.clone(), &msg)?;
    e.set("code", code)?;
    e.set("syscall", syscall)?;
    e.set("path", path)?;
    Ok(e.into_value())
}

/// Sync host call, result delivered as an already-settled promise (no `futures` feature needed).
fn settled<'js>(ctx: &Ctx<'js>, r: rquickjs::Result<std::result::Result<Value<'js>, Value<'js>>>) -> rquickjs::Result<Promise<'js>> {
    let (promise, resolve, reject) = ctx.promise()?;
    match r? {
        Ok(v) => resolve.call::<_, ()>((v,))?,
        Err(e) => reject.call::<_, ()>((e,))?,
    }
    Ok(promise)
}

fn wants_text(opt: &Opt<Value<'_>>) -> bool {
    match &opt.0 {
        Some(v) if v.is_string() => true,
        Some(v) => v
            .as_object()
            .and_then(|o| o.get::<_, Option<String>>("encoding").ok().flatten())
            .is_some(),
        None => false,
    }
}

struct FsModule;

impl ModuleDef for FsModule {
    fn declare(decl: &Declarations) -> rquickjs::Result<()> {
        decl.declare("readFile")?;
        decl.declare("writeFile")?;
        decl.declare("readFileAsync")?;
        decl.declare("default")?;
        Ok(())
    }

    fn evaluate<'js>(ctx: &Ctx<'js>, exports: &Exports<'js>) -> rquickjs::Result<()> {
        let files = ctx
            .userdata::<FsHost>()
            .ok_or_else(|| Exception::throw_internal(ctx, "fs host not installed"))?
            .0
            .clone();

        // readFile(path[, 'utf8' | {encoding}]) -> Promise<string | Uint8Array>
        let f = files.clone();
        let read_file = Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, path: String, enc: Opt<Value<'js>>| -> rquickjs::Result<Promise<'js>> {
                let got = f.borrow().get(&path).cloned();
                let r = match got {
                    Some(bytes) if wants_text(&enc) => {
                        Ok(Ok(rquickjs::String::from_str(ctx.clone(), &String::from_utf8_lossy(&bytes))?.into_value()))
                    }
                    Some(bytes) => Ok(Ok(TypedArray::<u8>::new(ctx.clone(), bytes)?.into_value())),
                    None => node_error(&ctx, "ENOENT", "open", &path).map(Err),
                };
                settled(&ctx, r)
            },
        )?
        .with_name("readFile")?;

        // writeFile(path, string | Uint8Array) -> Promise<undefined>
        let f = files.clone();
        let write_file = Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, path: String, data: Value<'js>| -> rquickjs::Result<Promise<'js>> {
                let bytes = if let Some(s) = data.as_string() {
                    s.to_string()?.into_bytes()
                } else if let Ok(a) = TypedArray::<u8>::from_value(data.clone()) {
                    // SAFETY: no JS runs while the slice is borrowed (copied at once).
                    unsafe { a.as_bytes() }.map(|b| b.to_vec()).unwrap_or_default()
                } else {
                    return Err(Exception::throw_type(&ctx, "data must be a string or Uint8Array"));
                };
                f.borrow_mut().insert(path, bytes);
                settled(&ctx, Ok(Ok(Value::new_undefined(ctx.clone()))))
            },
        )?
        .with_name("writeFile")?;

        // The same read, as a real Rust future (feature "futures"): `Async(closure -> Future)`.
        // Only drives under AsyncRuntime; awaits a tokio timer to prove it suspends.
        let f = files.clone();
        let read_file_async = Function::new(
            ctx.clone(),
            Async(move |ctx: Ctx<'js>, path: String| {
                let f = f.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    let got = f.borrow().get(&path).cloned();
                    match got {
                        Some(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
                        None => Err(ctx.throw(node_error(&ctx, "ENOENT", "open", &path)?)),
                    }
                }
            }),
        )?
        .with_name("readFileAsync")?;

        let default = Object::new(ctx.clone())?;
        default.set("readFile", read_file.clone())?;
        default.set("writeFile", write_file.clone())?;
        default.set("readFileAsync", read_file_async.clone())?;
        exports.export("readFile", read_file)?;
        exports.export("writeFile", write_file)?;
        exports.export("readFileAsync", read_file_async)?;
        exports.export("default", default)?;
        Ok(())
    }
}

// ---------------------------------------------------------------- (4) console

fn format_args<'js>(ctx: &Ctx<'js>, args: &[Value<'js>]) -> String {
    args.iter()
        .map(|v| {
            if let Some(s) = v.as_string() {
                s.to_string().unwrap_or_default()
            } else if v.is_object() && !v.is_function() && Exception::from_value(v.clone()).is_err() {
                ctx.json_stringify(v.clone())
                    .ok()
                    .flatten()
                    .and_then(|s| s.to_string().ok())
                    .unwrap_or_else(|| "[object]".into())
            } else {
                v.get::<Coerced<String>>().map(|c| c.0).unwrap_or_default()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn install_console<'js>(ctx: &Ctx<'js>, con: &Console) -> rquickjs::Result<()> {
    let console = Object::new(ctx.clone())?;
    for level in ["log", "info", "warn", "error", "debug"] {
        let con = con.clone();
        let f = Function::new(ctx.clone(), move |ctx: Ctx<'js>, args: Rest<Value<'js>>| -> rquickjs::Result<()> {
            let text = format_args(&ctx, &args.0);
            let n = con.bytes.get() + text.len() + 1;
            con.bytes.set(n);
            if n > con.max_bytes {
                con.over_budget.set(true); // the interrupt handler turns this into an uncatchable stop
                return Err(Exception::throw_range(&ctx, "output limit exceeded"));
            }
            let ev = Event { at_us: con.start.elapsed().as_micros(), level: level.to_string(), text };
            if con.echo {
                println!("    [console.{} @{}us] {}", ev.level, ev.at_us, ev.text);
            }
            con.events.borrow_mut().push(ev);
            Ok(())
        })?
        .with_name(level)?;
        console.set(level, f)?;
    }
    ctx.globals().set("console", console)
}

// ---------------------------------------------------------------- one sandboxed run

struct Limits {
    memory: usize,
    wall: Duration,
    stack: usize,
    output: usize,
    result: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { memory: 64 << 20, wall: Duration::from_secs(2), stack: 512 << 10, output: 1 << 20, result: 1 << 20 }
    }
}

/// Host-side view of an error: `name: message (uncatchable?) @ first stack frame`.
fn describe<'js>(ctx: &Ctx<'js>, e: Error) -> String {
    if !matches!(e, Error::Exception) {
        return format!("rust Error::{e:?}");
    }
    let v = ctx.catch();
    let uncatchable = v.is_uncatchable_error();
    match Exception::from_value(v.clone()) {
        Ok(ex) => {
            let name: String = ex.get("name").unwrap_or_else(|_| "?".into());
            let at = ex.stack().unwrap_or_default().lines().next().unwrap_or("").trim().to_string();
            format!("{name}: {}{} [{at}]", ex.message().unwrap_or_default(), if uncatchable { " (uncatchable)" } else { "" })
        }
        Err(_) => format!("thrown non-Error: {v:?}"),
    }
}

/// Drive the job queue until `v` (a promise, or any value) settles. Uses
/// `Runtime::execute_pending_job` (not `Promise::finish`/`Ctx::execute_pending_job`, which
/// swallow an exception thrown inside a job, e.g. the interrupt, and report `WouldBlock`).
fn settle(rt: &Runtime, ctx: &Context, v: Persistent<Value<'static>>) -> std::result::Result<Persistent<Value<'static>>, String> {
    loop {
        let state = ctx.with(|ctx| {
            let v = v.clone().restore(&ctx).unwrap();
            let Some(p) = v.as_promise() else { return Some(Ok(Persistent::save(&ctx, v))) };
            match p.result::<Value>() {
                None => None,
                Some(Ok(x)) => Some(Ok(Persistent::save(&ctx, x))),
                Some(Err(e)) => Some(Err(describe(&ctx, e))),
            }
        });
        if let Some(r) = state {
            return r;
        }
        match rt.execute_pending_job() {
            Ok(true) => {}
            Ok(false) => return Err("promise can never settle: job queue empty".into()),
            Err(job) => {
                return Err(job.0.with(|ctx| format!("in a job: {}", describe(&ctx, Error::Exception))))
            }
        }
    }
}

struct RunOutcome {
    result: std::result::Result<String, String>,
    events: Vec<Event>,
    elapsed: Duration,
}

/// Fresh Runtime + Context, modules from `files`, default export of `/main.js` called with `input`.
fn run(files: &Files, input: &str, limits: &Limits, echo: bool) -> RunOutcome {
    let start = Instant::now();
    let rt = Runtime::new().expect("runtime");
    rt.set_memory_limit(limits.memory);
    rt.set_max_stack_size(limits.stack);
    let con = Console {
        start,
        events: Rc::new(RefCell::new(Vec::new())),
        bytes: Rc::new(Cell::new(0)),
        max_bytes: limits.output,
        over_budget: Rc::new(Cell::new(false)),
        echo,
    };
    let deadline = start + limits.wall;
    let over = con.over_budget.clone();
    rt.set_interrupt_handler(Some(Box::new(move || over.get() || Instant::now() >= deadline)));
    rt.set_loader(WsResolver { allow: vec!["fs"] }, WsLoader { files: files.clone() });
    let ctx = Context::full(&rt).expect("context");
    let result = (|| -> std::result::Result<String, String> {
        ctx.with(|ctx| -> std::result::Result<(), String> {
            ctx.store_userdata(FsHost(files.clone())).map_err(|e| e.to_string())?;
            install_console(&ctx, &con).map_err(|e| e.to_string())
        })?;
        let imported = ctx.with(|ctx| {
            Module::import(&ctx, "/main.js")
                .map(|p| Persistent::save(&ctx, p.into_value()))
                .map_err(|e| describe(&ctx, e))
        })?;
        let ns = settle(&rt, &ctx, imported)?;
        let ret = ctx.with(|ctx| {
            let caught = |e: Error| describe(&ctx, e);
            let input = ctx.json_parse(input).map_err(caught)?;
            let ns: Object = ns.restore(&ctx).map_err(caught)?.into_object().ok_or("namespace")?;
            let main: Function = ns.get("default").map_err(caught)?;
            let ret: Value = main.call((input,)).map_err(caught)?;
            Ok::<_, String>(Persistent::save(&ctx, ret))
        })?;
        let ret = settle(&rt, &ctx, ret)?;
        ctx.with(|ctx| {
            let caught = |e: Error| describe(&ctx, e);
            let ret = ret.restore(&ctx).map_err(caught)?;
            let json = ctx
                .json_stringify(ret)
                .map_err(caught)?
                .map(|s| s.to_string().unwrap_or_default())
                .unwrap_or_else(|| "null".into());
            if json.len() > limits.result {
                return Err(format!("result too large: {} bytes", json.len()));
            }
            Ok(json)
        })
    })();
    let events = con.events.borrow().clone();
    RunOutcome { result, events, elapsed: start.elapsed() }
}

fn show(title: &str, o: &RunOutcome) {
    println!("  {title}: {:?}  ({} us, {} console events)", o.result, o.elapsed.as_micros(), o.events.len());
}

// ---------------------------------------------------------------- sections

fn s1_default_export() {
    println!("\n(1) ES module, default export async fn(JSON) -> JSON");
    let files = files_of(&[(
        "/main.js",
        "export default async function (input) {\n  await null;\n  return { sum: input.xs.reduce((a, b) => a + b, 0), echo: input, nested: [1, 'two', null, true] };\n}\n",
    )]);
    show("result", &run(&files, r#"{"xs":[1,2,3],"name":"probe"}"#, &Limits::default(), false));
    let files = files_of(&[("/main.js", "export default async () => { throw new TypeError('bad input') }")]);
    show("rejection", &run(&files, "{}", &Limits::default(), false));
    let files = files_of(&[("/main.js", "export default (x) => x.a.b")]);
    show("sync throw", &run(&files, "{}", &Limits::default(), false));
    let files = files_of(&[("/main.js", "export default () => ({ f() {}, u: undefined, n: 1n })")]);
    show("non-JSON result (BigInt)", &run(&files, "{}", &Limits::default(), false));
    let files = files_of(&[("/main.js", "export default () => 'x'.repeat(2000)")]);
    show("result over 1 KiB cap", &run(&files, "{}", &Limits { result: 1024, ..Limits::default() }, false));
}

fn s2_loader() {
    println!("\n(2) custom resolver + loader over an in-memory map");
    let files = files_of(&[
        ("/main.js", "import { add } from './lib/math.js';\nimport def from './lib/math.js';\nexport default async () => ({ add: add(2, 3), def: def(), dyn: (await import('./lib/dyn.js')).v });\n"),
        ("/lib/math.js", "import { k } from '../const.js';\nexport const add = (a, b) => a + b + k;\nexport default () => 'math default';\n"),
        ("/const.js", "export const k = 0;"),
        ("/lib/dyn.js", "export const v = 'dynamic import ok';"),
    ]);
    show("relative imports", &run(&files, "{}", &Limits::default(), false));
    for spec in ["lodash", "node:child_process", "std", "os", "./missing.js", "../../etc/passwd"] {
        let files = files_of(&[("/main.js", &format!("import * as m from '{spec}';\nexport default () => Object.keys(m);"))]);
        show(&format!("static import '{spec}'"), &run(&files, "{}", &Limits::default(), false));
    }
    let files = files_of(&[("/main.js", "export default async () => { try { await import('lodash'); return 'loaded?!' } catch (e) { return 'caught: ' + e.name + ': ' + e.message } }")]);
    show("dynamic import('lodash') caught by script", &run(&files, "{}", &Limits::default(), false));
}

fn s3_fs() {
    println!("\n(3) native module `fs` (promise-returning functions over the in-memory map)");
    let files = files_of(&[
        ("/main.js", "import fs from 'fs';\nimport { readFile, writeFile } from 'fs';\nexport default async ({ path }) => {\n  const before = await readFile(path, 'utf8');\n  await writeFile(path, before.toUpperCase());\n  await fs.writeFile('/out.bin', new Uint8Array([1, 2, 255]));\n  const bin = await fs.readFile('/out.bin');\n  let err;\n  try { await readFile('/nope.txt') } catch (e) { err = { name: e.name, code: e.code, syscall: e.syscall, message: e.message } }\n  const p = readFile(path);\n  return { before, after: await readFile(path, { encoding: 'utf8' }), isPromise: p instanceof Promise, bin: [bin.constructor.name, ...bin], err };\n};\n"),
        ("/data.txt", "hello from the workspace"),
    ]);
    let o = run(&files, r#"{"path":"/data.txt"}"#, &Limits::default(), false);
    show("sync host call + settled promise", &o);
    println!("  host map after run: /data.txt = {:?}, /out.bin = {:?}",
        String::from_utf8_lossy(&files.borrow()["/data.txt"]), files.borrow()["/out.bin"]);
}

fn s3b_async() {
    println!("\n(3b) same module under AsyncRuntime/AsyncContext (feature `futures`), readFileAsync = Async(closure -> Future)");
    let files = files_of(&[
        ("/main.js", "import { readFileAsync } from 'fs';\nexport default async () => {\n  const t = Date.now();\n  const [a, b] = await Promise.all([readFileAsync('/data.txt'), readFileAsync('/data.txt')]);\n  let err; try { await readFileAsync('/nope') } catch (e) { err = e.code + ' ' + e.message }\n  return { a, same: a === b, err };\n};\n"),
        ("/data.txt", "async hello"),
    ]);
    let tokio_rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    tokio_rt.block_on(async {
        let t = Instant::now();
        let rt = AsyncRuntime::new().unwrap();
        rt.set_memory_limit(64 << 20).await;
        let deadline = Instant::now() + Duration::from_secs(2);
        rt.set_interrupt_handler(Some(Box::new(move || Instant::now() >= deadline))).await;
        rt.set_loader(WsResolver { allow: vec!["fs"] }, WsLoader { files: files.clone() }).await;
        let ctx = AsyncContext::full(&rt).await.unwrap();
        let files2 = files.clone();
        let res: std::result::Result<String, String> = ctx.async_with(async |ctx| {
            ctx.store_userdata(FsHost(files2)).map_err(|e| e.to_string())?;
            let caught = |e: Error| describe(&ctx, e);
            let ns: Object = Module::import(&ctx, "/main.js").map_err(caught)?.into_future().await.map_err(caught)?;
            let main: Function = ns.get("default").map_err(caught)?;
            let p: Promise = main.call(()).map_err(caught)?;
            let v: Value = p.into_future().await.map_err(caught)?;
            Ok(ctx.json_stringify(v).map_err(caught)?.unwrap().to_string().unwrap())
        })
        .await;
        rt.idle().await;
        println!("  result: {res:?}  ({} us: 2 concurrent + 1 sequential 5 ms tokio sleeps)", t.elapsed().as_micros());
    });
}

fn s3c_async_interrupt() {
    println!("\n(3c) AsyncRuntime: interrupt (200 ms) during a busy loop after `await` (a promise job)");
    let tokio_rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    tokio_rt.block_on(async {
        let t = Instant::now();
        let rt = AsyncRuntime::new().unwrap();
        let deadline = Instant::now() + Duration::from_millis(200);
        rt.set_interrupt_handler(Some(Box::new(move || Instant::now() >= deadline))).await;
        let ctx = AsyncContext::full(&rt).await.unwrap();
        let fut = ctx.async_with(async |ctx| {
            let p: Promise = ctx.eval("(async () => { await null; for (;;) {} })()").unwrap();
            p.into_future::<Value>().await.map(|_| ()).map_err(|e| describe(&ctx, e))
        });
        let res = tokio::time::timeout(Duration::from_secs(3), fut).await;
        println!("  into_future result: {res:?} after {} us", t.elapsed().as_micros());
    });
}

fn s4_console() {
    println!("\n(4) console.* captured by Rust as it happens (echoed live below)");
    let files = files_of(&[(
        "/main.js",
        "export default async () => {\n  console.log('start', 1, { a: [1, 2] }, null, undefined);\n  const t = Date.now(); while (Date.now() - t < 30) {}\n  console.warn('after 30 ms busy');\n  await null;\n  console.error(new Error('boom'));\n  console.info('done');\n  return 'ok';\n};\n",
    )]);
    let o = run(&files, "{}", &Limits::default(), true);
    show("run", &o);
    println!("  (timestamps are host-side, taken in the Rust callback: the 30 ms gap shows capture is live, not batched)");
    let files = files_of(&[(
        "/main.js",
        "export default () => { let n = 0; for (;;) { try { console.log('x'.repeat(100)); n++ } catch (e) { /* script swallows it */ } } }",
    )]);
    let o = run(&files, "{}", &Limits { output: 1024, ..Limits::default() }, false);
    show("output cap 1 KiB, script swallows the RangeError", &o);
}

fn s5_interrupt() {
    println!("\n(5) interrupt handler vs while(true){{}} (wall limit 200 ms)");
    let lim = Limits { wall: Duration::from_millis(200), ..Limits::default() };
    let files = files_of(&[("/main.js", "export default () => { while (true) {} }")]);
    show("sync busy loop", &run(&files, "{}", &lim, false));
    let files = files_of(&[("/main.js", "export default async () => { try { while (true) {} } catch (e) { return 'script caught: ' + e } finally { console.log('finally ran') } }")]);
    show("busy loop inside try/catch/finally", &run(&files, "{}", &lim, false));
    let files = files_of(&[("/main.js", "export default async () => { await null; for (;;) {} }")]);
    show("busy loop after await (in a promise job)", &run(&files, "{}", &lim, false));
    let files = files_of(&[("/main.js", "while (true) {}\nexport default () => 1")]);
    show("busy loop at module top level", &run(&files, "{}", &lim, false));
    let files = files_of(&[("/main.js", "export default () => { const re = /(a+)+$/; return re.test('a'.repeat(40) + 'b') }")]);
    show("catastrophic regex backtracking", &run(&files, "{}", &lim, false));

    // Same runtime after an interrupt: still usable?
    let rt = Runtime::new().unwrap();
    let stop = Rc::new(Cell::new(Instant::now() + Duration::from_millis(100)));
    let s = stop.clone();
    rt.set_interrupt_handler(Some(Box::new(move || Instant::now() >= s.get())));
    let ctx = Context::full(&rt).unwrap();
    ctx.with(|ctx| {
        let r: rquickjs::Result<()> = ctx.eval("while(true){}");
        let e = r.map_err(|e| describe(&ctx, e));
        println!("  raw ctx.eval: {e:?}");
        stop.set(Instant::now() + Duration::from_secs(5));
        let after: rquickjs::Result<i32> = ctx.eval("1 + 1");
        println!("  same runtime+context afterwards, deadline reset: 1+1 = {:?}", after.ok());
    });
}

fn s6_memory() {
    println!("\n(6) memory limit 32 MiB vs allocation bomb");
    let lim = Limits { memory: 32 << 20, ..Limits::default() };
    let files = files_of(&[("/main.js", "export default () => { let a = []; while (true) a.push(new Array(1e6).fill(1)); }")]);
    show("bomb (uncaught)", &run(&files, "{}", &lim, false));
    let files = files_of(&[("/main.js", "export default () => { let a = []; try { while (true) a.push(new Array(1e6).fill(1)); } catch (e) { a = null; return 'script caught: ' + e + ' / ' + e.name } }")]);
    show("bomb inside try/catch", &run(&files, "{}", &lim, false));
    let files = files_of(&[("/main.js", "export default () => { let s = 'x'; for (;;) s += s; }")]);
    show("string doubling", &run(&files, "{}", &lim, false));
    let files = files_of(&[("/main.js", "function f(n) { return f(n + 1) + 1 }\nexport default () => f(0)")]);
    show("unbounded recursion (max stack 512 KiB)", &run(&files, "{}", &lim, false));

    // Same runtime afterwards.
    let rt = Runtime::new().unwrap();
    rt.set_memory_limit(32 << 20);
    let ctx = Context::full(&rt).unwrap();
    ctx.with(|ctx| {
        let r: rquickjs::Result<()> = ctx.eval("globalThis.keep = []; while (true) keep.push(new Array(1e6).fill(1));");
        println!("  raw ctx.eval: {:?}", r.map_err(|e| describe(&ctx, e)));
    });
    let m = rt.memory_usage();
    println!("  memory_usage after bomb (global still holds it): malloc_size={} malloc_limit={}", m.malloc_size, m.malloc_limit);
    ctx.with(|ctx| {
        let r: rquickjs::Result<i32> = ctx.eval("1 + 1");
        println!("  same context while full: 1+1 = {:?}", r.map_err(|e| describe(&ctx, e)));
        let r: rquickjs::Result<usize> = ctx.eval("keep.length");
        println!("  keep.length = {:?}", r.ok());
        let _: rquickjs::Result<()> = ctx.eval("keep = null");
    });
    rt.run_gc();
    let m = rt.memory_usage();
    println!("  after `keep = null` + run_gc: malloc_size={}", m.malloc_size);
    ctx.with(|ctx| {
        let r: rquickjs::Result<usize> = ctx.eval("new Array(1e5).fill(2).length");
        println!("  same runtime afterwards: new Array(1e5) -> {:?}", r.ok());
    });
    drop(ctx);
    let ctx2 = Context::full(&rt).unwrap();
    ctx2.with(|ctx| println!("  new context in same runtime: {:?}", ctx.eval::<i32, _>("2 * 21").ok()));
}

fn stats(mut v: Vec<u128>) -> String {
    v.sort();
    let n = v.len();
    format!("min {} / median {} / p95 {} / max {} us (n={n})", v[0], v[n / 2], v[n * 95 / 100], v[n - 1])
}

fn s7_cost() {
    println!("\n(7) fresh Runtime+Context per run: cost");
    let files = files_of(&[("/main.js", "export default async (x) => x")]);
    // cold: the first run in this process (run `probe 7` alone for a truly cold figure)
    let t = Instant::now();
    let o = run(&files, r#"{"a":1}"#, &Limits::default(), false);
    println!("  cold first full run: {} us -> {:?}", t.elapsed().as_micros(), o.result);
    let (mut rt_only, mut rt_ctx, mut base, mut full) = (vec![], vec![], vec![], vec![]);
    for _ in 0..100 {
        let t = Instant::now();
        drop(Runtime::new().unwrap());
        rt_only.push(t.elapsed().as_micros());
        let t = Instant::now();
        let rt = Runtime::new().unwrap();
        let ctx = Context::full(&rt).unwrap();
        drop(ctx);
        drop(rt);
        rt_ctx.push(t.elapsed().as_micros());
        let t = Instant::now();
        let rt = Runtime::new().unwrap();
        let ctx = Context::base(&rt).unwrap();
        drop(ctx);
        drop(rt);
        base.push(t.elapsed().as_micros());
        let t = Instant::now();
        let o = run(&files, r#"{"a":1}"#, &Limits::default(), false);
        assert_eq!(o.result.as_deref(), Ok(r#"{"a":1}"#));
        full.push(t.elapsed().as_micros());
    }
    println!("  Runtime::new + drop:                  {}", stats(rt_only));
    println!("  Runtime::new + Context::full + drop:  {}", stats(rt_ctx));
    println!("  Runtime::new + Context::base + drop:  {}", stats(base));
    println!("  full run (rt, limits, loader, console, import /main.js, call, JSON out, drop): {}", stats(full));

    {
        let rt = Runtime::new().unwrap();
        let m0 = rt.memory_usage().malloc_size;
        let ctx = Context::full(&rt).unwrap();
        let m1 = rt.memory_usage().malloc_size;
        ctx.with(|ctx| { let _: rquickjs::Result<()> = ctx.eval("1"); });
        drop(ctx);
        println!("  heap (memory_usage().malloc_size): empty Runtime {} B, + Context::full {} B", m0, m1);
    }
    // Interrupt handler overhead on a tight loop.
    for with_handler in [false, true] {
        let rt = Runtime::new().unwrap();
        if with_handler {
            let deadline = Instant::now() + Duration::from_secs(60);
            rt.set_interrupt_handler(Some(Box::new(move || Instant::now() >= deadline)));
        }
        let ctx = Context::full(&rt).unwrap();
        let t = Instant::now();
        let n: f64 = ctx.with(|ctx| ctx.eval("let s = 0; for (let i = 0; i < 1e7; i++) s += i; s").unwrap());
        println!("  1e7-iteration loop, interrupt handler {}: {} ms (sum {n})", if with_handler { "on " } else { "off" }, t.elapsed().as_millis());
    }
}

fn s8_globals() {
    println!("\n(8) what the script can reach");
    let rt = Runtime::new().unwrap();
    let ctx = Context::full(&rt).unwrap();
    ctx.with(|ctx| {
        let names: Vec<String> = ctx.eval("Object.getOwnPropertyNames(globalThis).sort()").unwrap();
        println!("  Context::full globals ({}): {}", names.len(), names.join(" "));
        let probe: String = ctx
            .eval("JSON.stringify(['std','os','require','process','fetch','XMLHttpRequest','WebSocket','console','print','scriptArgs','setTimeout','queueMicrotask','performance','navigator','Deno','Bun','module','exports','__filename','importScripts','WebAssembly','SharedArrayBuffer','Atomics','eval','Function'].map(n => n + ':' + typeof globalThis[n]))")
            .unwrap();
        println!("  typeof: {probe}");
        for spec in ["std", "os", "/etc/passwd", "./x.js"] {
            let r: rquickjs::Result<Promise> = ctx.eval(format!("import('{spec}')"));
            let r = r.and_then(|p| p.finish::<Value>());
            println!("  import('{spec}') with no loader installed: {:?}", r.map(|_| ()).map_err(|e| describe(&ctx, e)));
        }
        let r: rquickjs::Result<String> = ctx.eval("JSON.stringify(Object.getOwnPropertyNames(performance))");
        println!("  performance own props: {:?}; performance.now() = {:?}", r.ok(), ctx.eval::<f64, _>("performance.now()").ok());
        let r: rquickjs::Result<String> = ctx.eval("typeof SharedArrayBuffer + ' ' + typeof Atomics.wait");
        println!("  SharedArrayBuffer / Atomics.wait: {:?}", r.ok());
        let r: rquickjs::Result<String> = ctx.eval("new Function('return typeof this')()");
        println!("  new Function works (in-sandbox only): {:?}", r.ok());
    });
    let ctx = Context::base(&rt).unwrap();
    ctx.with(|ctx| {
        let r: rquickjs::Result<i32> = ctx.eval("1");
        println!("  Context::base: ctx.eval(\"1\") -> {:?}", r.map_err(|e| describe(&ctx, e)));
    });
    let ctx = Context::custom::<rquickjs::context::intrinsic::Eval>(&rt).unwrap();
    ctx.with(|ctx| {
        let names: Vec<String> = ctx.eval("Object.getOwnPropertyNames(globalThis).sort()").unwrap();
        println!("  Context::custom::<intrinsic::Eval> globals ({}): {}", names.len(), names.join(" "));
    });
}

fn main() {
    println!("rquickjs probe: rquickjs 0.14.0, QuickJS-NG {}", unsafe {
        std::ffi::CStr::from_ptr(rquickjs::qjs::JS_GetVersion()).to_string_lossy()
    });
    let which: Vec<String> = std::env::args().skip(1).collect();
    let on = |s: &str| which.is_empty() || which.iter().any(|w| w == s);
    if on("1") { s1_default_export(); }
    if on("2") { s2_loader(); }
    if on("3") { s3_fs(); s3b_async(); s3c_async_interrupt(); }
    if on("4") { s4_console(); }
    if on("5") { s5_interrupt(); }
    if on("6") { s6_memory(); }
    if on("7") { s7_cost(); }
    if on("8") { s8_globals(); }
}
