//! One run of a module: a thread with a fresh QuickJS runtime and context, the module
//! loader over the workspace, the console on the exec's pipes, the default export
//! called and awaited, and the [`Process`] that stops it.
//!
//! Stopping: QuickJS calls the interrupt handler while it runs; the handler ends the
//! script when a signal came (a kill, or the spine's timeout, which the policy's
//! `timeout` bounds) or the console wrote too much. The end is uncatchable by the
//! script.

use std::cell::Cell;
use std::io::{PipeReader, PipeWriter, Read, Write};
use std::rc::Rc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use rquickjs::loader::{ImportAttributes, Loader, Resolver};
use rquickjs::prelude::{Coerced, Rest};
use rquickjs::{Context, Ctx, Exception, Function, Module, Object, Persistent, Runtime, Value};

use super::fs_module::{self, FsHost, FS_MODULE};
use super::{JsLimits, JsPolicy};
use crate::backend::{signal_of, Process, SpawnRequest, Spawned};
use crate::error::{Error, Result};
use crate::linux::SANDBOX_WORKSPACE;

/// Exit status of a module that threw (or whose promise rejected).
pub const EXIT_JS_THREW: i32 = 1;
/// Exit status of a run that hit one of the backend's limits.
pub const EXIT_JS_LIMIT: i32 = 125;
/// The name the exec's source is loaded under, in its working directory.
const ENTRY_NAME: &str = "[exec].js";

/// The running module, as the spine sees a process.
pub(crate) struct JsProcess {
    ended: Mutex<Option<(i32, Option<String>)>>,
    woken: Condvar,
    /// The signal that stopped it; 0 while none came.
    stopped_by: Arc<AtomicI32>,
}

impl JsProcess {
    fn end(&self, code: i32, value: Option<String>) {
        *self.ended.lock().unwrap_or_else(|e| e.into_inner()) = Some((code, value));
        self.woken.notify_all();
    }

    fn ended(&self) -> (i32, Option<String>) {
        let mut ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(ended) = &*ended {
                return ended.clone();
            }
            ended = self.woken.wait(ended).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Process for JsProcess {
    fn signal(&self, signal: i32) -> Result<()> {
        let signal = signal_of(signal)?;
        use nix::sys::signal::Signal::*;
        if matches!(signal, SIGCHLD | SIGCONT | SIGURG | SIGWINCH) {
            return Ok(());
        }
        let _ = (self.stopped_by).compare_exchange(
            0,
            signal as i32,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        Ok(())
    }

    fn kill_all(&self) -> Result<()> {
        self.signal(libc::SIGKILL)
    }

    fn wait(&self) -> Result<i32> {
        Ok(self.ended().0)
    }

    fn value(&self) -> Option<String> {
        self.ended().1
    }
}

/// Starts the exec's module on a thread of its own.
pub(crate) fn start(host: FsHost, policy: &JsPolicy, request: &SpawnRequest) -> Result<Spawned> {
    let pipes = || std::io::pipe().map_err(Error::io("making the js backend's pipes"));
    let (stdin_reader, stdin) = pipes()?;
    let (stdout, stdout_writer) = pipes()?;
    let (stderr, stderr_writer) = pipes()?;
    let process = Arc::new(JsProcess {
        ended: Mutex::new(None),
        woken: Condvar::new(),
        stopped_by: Arc::new(AtomicI32::new(0)),
    });
    let job = Job {
        host: Arc::new(host),
        imports: policy.imports.clone(),
        limits: policy.limits.clone(),
        source: request.script.clone(),
        cwd: request.cwd.clone(),
        stopped_by: process.stopped_by.clone(),
    };
    let running = process.clone();
    std::thread::Builder::new()
        .name(format!("js-{}", request.exec_id))
        .spawn(move || {
            let bytes_max = job.limits.output_bytes_max;
            let console = Console::new(stdout_writer, stderr_writer, bytes_max);
            let (code, value) = Evaluation { job, console }.run(stdin_reader);
            running.end(code, value);
        })
        .map_err(Error::io("starting the js backend's thread"))?;
    Ok(Spawned::in_process(stdin, stdout, stderr, process))
}

/// The console's pipes and what it may still write.
#[derive(Clone)]
struct Console {
    out: Rc<std::cell::RefCell<(Option<PipeWriter>, Option<PipeWriter>)>>,
    left: Rc<Cell<usize>>,
    /// Set when a write went past the budget: the interrupt handler ends the run.
    over: Rc<Cell<bool>>,
}

impl Console {
    fn new(stdout: PipeWriter, stderr: PipeWriter, bytes_max: usize) -> Console {
        Console {
            out: Rc::new(std::cell::RefCell::new((Some(stdout), Some(stderr)))),
            left: Rc::new(Cell::new(bytes_max)),
            over: Rc::new(Cell::new(false)),
        }
    }

    fn write(&self, to_stderr: bool, text: &str) {
        let Some(left) = self.left.get().checked_sub(text.len()) else {
            self.over.set(true);
            return;
        };
        self.left.set(left);
        let mut out = self.out.borrow_mut();
        let pipe = if to_stderr { &mut out.1 } else { &mut out.0 };
        if let Some(writer) = pipe {
            if writer.write_all(text.as_bytes()).is_err() {
                *pipe = None; // the reader went away: not the script's error
            }
        }
    }
}

/// What to run, sent to the run's thread.
struct Job {
    host: Arc<FsHost>,
    imports: Vec<String>,
    limits: JsLimits,
    source: String,
    cwd: String,
    stopped_by: Arc<AtomicI32>,
}

/// How a run ended, before it is an exit status.
enum Ended {
    Returned(String),
    Threw(String),
    Limit(String),
}

/// A job on its thread, with its console.
struct Evaluation {
    job: Job,
    console: Console,
}

impl Evaluation {
    fn run(self, stdin: PipeReader) -> (i32, Option<String>) {
        let input = match read_input(stdin, self.job.limits.input_bytes_max) {
            Ok(input) => input,
            Err(why) => return self.report(Ended::Limit(why)),
        };
        let ended = self.evaluate(&input);
        self.report(ended)
    }

    fn report(&self, ended: Ended) -> (i32, Option<String>) {
        let signal = self.job.stopped_by.load(Ordering::SeqCst);
        if signal != 0 {
            return (128 + signal, None);
        }
        match ended {
            Ended::Returned(value) => (0, Some(value)),
            Ended::Threw(why) => {
                self.console.write(true, &format!("js: {why}\n"));
                (EXIT_JS_THREW, None)
            }
            Ended::Limit(why) => {
                self.console.left.set(usize::MAX);
                self.console
                    .write(true, &format!("js: limit reached: {why}\n"));
                (EXIT_JS_LIMIT, None)
            }
        }
    }

    fn evaluate(&self, input: &str) -> Ended {
        let runtime = match Runtime::new() {
            Ok(runtime) => runtime,
            Err(err) => return Ended::Threw(format!("starting QuickJS: {err}")),
        };
        runtime.set_memory_limit(self.job.limits.memory_bytes_max);
        runtime.set_max_stack_size(self.job.limits.stack_bytes_max);
        let (stopped_by, over) = (self.job.stopped_by.clone(), self.console.over.clone());
        runtime.set_interrupt_handler(Some(Box::new(move || {
            over.get() || stopped_by.load(Ordering::Relaxed) != 0
        })));
        let entry = entry_name(&self.job.cwd);
        runtime.set_loader(
            WorkspaceResolver {
                imports: self.job.imports.clone(),
            },
            WorkspaceLoader {
                host: self.job.host.clone(),
                entry: (entry.clone(), self.job.source.clone()),
            },
        );
        let ended = match Context::full(&runtime) {
            Ok(context) => self.call_default(&runtime, &context, &entry, input),
            Err(err) => Ended::Threw(format!("starting a context: {err}")),
        };
        match ended {
            Ended::Threw(_) if self.console.over.get() => Ended::Limit("output bytes".into()),
            Ended::Threw(why) if why.contains("out of memory") => Ended::Limit(format!(
                "memory ({} MiB)",
                self.job.limits.memory_bytes_max >> 20
            )),
            other => other,
        }
    }

    /// Imports the entry, calls its default export with the input, awaits the value.
    fn call_default(
        &self,
        runtime: &Runtime,
        context: &Context,
        entry: &str,
        input: &str,
    ) -> Ended {
        let prepared = context.with(|ctx| {
            fs_module::install(&ctx, self.job.host.clone())?;
            install_console(&ctx, &self.console)?;
            let namespace = Module::import(&ctx, entry)?;
            Ok::<_, rquickjs::Error>(Persistent::save(&ctx, namespace.into_value()))
        });
        let namespace = match prepared {
            Ok(namespace) => namespace,
            Err(err) => return context.with(|ctx| Ended::Threw(describe(&ctx, err))),
        };
        let namespace = match settle(runtime, context, namespace) {
            Ok(namespace) => namespace,
            Err(why) => return Ended::Threw(why),
        };
        let returned = context.with(|ctx| {
            let namespace: Object = namespace.restore(&ctx)?.into_object().ok_or_else(|| {
                Exception::throw_type(&ctx, "the module did not load as a module")
            })?;
            let main: Value = namespace.get("default")?;
            let Some(main) = main.as_function() else {
                return Err(Exception::throw_type(
                    &ctx,
                    "the module has no default export function",
                ));
            };
            let input = ctx.json_parse(input)?;
            let returned: Value = main.call((input,))?;
            Ok(Persistent::save(&ctx, returned))
        });
        let returned = match returned {
            Ok(returned) => returned,
            Err(err) => return context.with(|ctx| Ended::Threw(describe(&ctx, err))),
        };
        match settle(runtime, context, returned) {
            Ok(value) => self.as_json(context, value),
            Err(why) => Ended::Threw(why),
        }
    }

    fn as_json(&self, context: &Context, value: Persistent<Value<'static>>) -> Ended {
        context.with(|ctx| {
            let json = value
                .restore(&ctx)
                .and_then(|value| ctx.json_stringify(value))
                .map(|text| text.and_then(|t| t.to_string().ok()));
            match json {
                Ok(Some(json)) if json.len() > self.job.limits.value_bytes_max => {
                    Ended::Limit(format!(
                        "the value is {} bytes of JSON, over {}",
                        json.len(),
                        self.job.limits.value_bytes_max
                    ))
                }
                Ok(Some(json)) => Ended::Returned(json),
                Ok(None) => Ended::Returned("null".into()),
                Err(err) => Ended::Threw(describe(&ctx, err)),
            }
        })
    }
}

/// The exec's input: its stdin as JSON text (none: `null`).
fn read_input(stdin: PipeReader, bytes_max: usize) -> std::result::Result<String, String> {
    let mut input = String::new();
    let read = stdin.take(bytes_max as u64 + 1).read_to_string(&mut input);
    read.map_err(|err| format!("reading the input: {err}"))?;
    if input.len() > bytes_max {
        return Err(format!("the input is over {bytes_max} bytes"));
    }
    Ok(if input.trim().is_empty() {
        "null".into()
    } else {
        input
    })
}

fn entry_name(cwd: &str) -> String {
    let dir = if cwd == "/" {
        String::new()
    } else {
        cwd.to_owned()
    };
    format!("{SANDBOX_WORKSPACE}{dir}/{ENTRY_NAME}")
}

/// Drives the job queue until `value` (a promise, or any value) settles. Jobs are run by
/// the runtime itself, so that an exception thrown in one (the interrupt) is seen.
fn settle(
    runtime: &Runtime,
    context: &Context,
    value: Persistent<Value<'static>>,
) -> std::result::Result<Persistent<Value<'static>>, String> {
    loop {
        let state = context.with(|ctx| {
            let value = match value.clone().restore(&ctx) {
                Ok(value) => value,
                Err(err) => return Some(Err(describe(&ctx, err))),
            };
            let Some(promise) = value.as_promise() else {
                return Some(Ok(Persistent::save(&ctx, value)));
            };
            match promise.result::<Value>() {
                None => None,
                Some(Ok(settled)) => Some(Ok(Persistent::save(&ctx, settled))),
                Some(Err(err)) => Some(Err(describe(&ctx, err))),
            }
        });
        if let Some(settled) = state {
            return settled;
        }
        match runtime.execute_pending_job() {
            Ok(true) => {}
            Ok(false) => return Err("the promise can never settle: nothing is left to run".into()),
            Err(job) => return Err(job.0.with(|ctx| describe(&ctx, rquickjs::Error::Exception))),
        }
    }
}

/// `Name: message` and the first frame of the stack, from a caught exception.
fn describe(ctx: &Ctx<'_>, err: rquickjs::Error) -> String {
    if !matches!(err, rquickjs::Error::Exception) {
        return err.to_string();
    }
    let caught = ctx.catch();
    match Exception::from_value(caught.clone()) {
        Ok(exception) => {
            let name: String = exception.get("name").unwrap_or_else(|_| "Error".into());
            let message = exception.message().unwrap_or_default();
            let stack = exception.stack().unwrap_or_default();
            let at = stack.lines().next().unwrap_or_default().trim().to_owned();
            if at.is_empty() {
                format!("{name}: {message}")
            } else {
                format!("{name}: {message} ({at})")
            }
        }
        Err(_) => format!(
            "threw {}",
            caught
                .get::<Coerced<String>>()
                .map(|c| c.0)
                .unwrap_or_default()
        ),
    }
}

fn install_console<'js>(ctx: &Ctx<'js>, console: &Console) -> rquickjs::Result<()> {
    let object = Object::new(ctx.clone())?;
    for (level, to_stderr) in [
        ("log", false),
        ("info", false),
        ("debug", false),
        ("warn", true),
        ("error", true),
    ] {
        let console = console.clone();
        let function = Function::new(ctx.clone(), move |ctx: Ctx<'js>, args: Rest<Value<'js>>| {
            let mut line = args
                .0
                .iter()
                .map(|v| shown(&ctx, v))
                .collect::<Vec<_>>()
                .join(" ");
            line.push('\n');
            console.write(to_stderr, &line);
        })?;
        object.set(level, function)?;
    }
    ctx.globals().set("console", object)
}

/// A console argument as text: strings as they are, objects as JSON.
fn shown<'js>(ctx: &Ctx<'js>, value: &Value<'js>) -> String {
    if let Some(text) = value.as_string() {
        return text.to_string().unwrap_or_default();
    }
    if value.is_object() && !value.is_function() && !value.is_error() {
        let json = ctx.json_stringify(value.clone()).ok().flatten();
        if let Some(json) = json.and_then(|j| j.to_string().ok()) {
            return json;
        }
    }
    value
        .get::<Coerced<String>>()
        .map(|c| c.0)
        .unwrap_or_default()
}

/// Relative and absolute imports resolve in the workspace; bare ones only if named.
struct WorkspaceResolver {
    imports: Vec<String>,
}

impl Resolver for WorkspaceResolver {
    fn resolve<'js>(
        &mut self,
        _ctx: &Ctx<'js>,
        base: &str,
        name: &str,
        _attributes: Option<ImportAttributes<'js>>,
    ) -> rquickjs::Result<String> {
        if name == "fs" || name == "node:fs" || name == "fs/promises" || name == "node:fs/promises"
        {
            return Ok("fs".into());
        }
        if name.starts_with("./") || name.starts_with("../") || name.starts_with('/') {
            let dir = base.rsplit_once('/').map_or("", |(dir, _)| dir);
            let joined = if name.starts_with('/') {
                name.to_owned()
            } else {
                format!("{dir}/{name}")
            };
            return normalized(&joined).ok_or_else(|| {
                rquickjs::Error::new_resolving_message(base, name, "it leads out of the workspace")
            });
        }
        if self.imports.iter().any(|allowed| allowed == name) {
            return Ok(format!("{SANDBOX_WORKSPACE}/node_modules/{name}/index.js"));
        }
        Err(rquickjs::Error::new_resolving_message(
            base,
            name,
            "bare imports other than `fs` must be named in the policy's js.imports",
        ))
    }
}

/// `/workspace/a/../b.js` as `/workspace/b.js`; `None` outside the workspace.
fn normalized(path: &str) -> Option<String> {
    let inside = path.strip_prefix(SANDBOX_WORKSPACE)?;
    let store = crate::spine::normalize_cwd(if inside.is_empty() { "/" } else { inside }).ok()?;
    Some(format!(
        "{SANDBOX_WORKSPACE}{}",
        if store == "/" { "" } else { &store }
    ))
}

/// Modules from the workspace store; `fs` from this crate; the exec's own source.
struct WorkspaceLoader {
    host: Arc<FsHost>,
    entry: (String, String),
}

impl Loader for WorkspaceLoader {
    fn load<'js>(
        &mut self,
        ctx: &Ctx<'js>,
        name: &str,
        _attributes: Option<ImportAttributes<'js>>,
    ) -> rquickjs::Result<Module<'js>> {
        if name == "fs" {
            return Module::declare(ctx.clone(), "fs", FS_MODULE);
        }
        if name == self.entry.0 {
            return Module::declare(ctx.clone(), name, self.entry.1.clone());
        }
        let store_path = name.strip_prefix(SANDBOX_WORKSPACE).unwrap_or(name);
        let source = self
            .host
            .read_module(store_path)
            .map_err(|why| rquickjs::Error::new_loading_message(name, why))?;
        Module::declare(ctx.clone(), name, source)
    }
}
