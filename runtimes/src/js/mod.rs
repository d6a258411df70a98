//! The `js` backend: an ES module run by QuickJS (rquickjs, pinned; see
//! docs/evaluations/rquickjs) inside the daemon, a fresh runtime and context per run.
//!
//! The script is the source of a module whose default export is called with the
//! caller's input (JSON, read from the exec's stdin; none is `null`) and whose return
//! value, awaited, is the result's `value` (JSON text). `console.log`/`info`/`debug`
//! write to stdout, `warn`/`error` to stderr, as they are called. The module imports
//! `fs` (promise-based, the common subset of Node's `fs/promises`) bound to the
//! workspace at `/workspace`, relative modules from the workspace, and bare modules
//! only where the policy names them. Nothing else: no network, no host file system,
//! no process.

mod fs_module;
mod run;

use std::sync::Arc;
use std::time::Duration;

use computer_vfs::Workspace;

use crate::backend::{Backend, Connection, Description, SpawnRequest, Spawned};
use crate::error::Result;
use crate::exec::SyncOutcome;
use crate::linux::SANDBOX_WORKSPACE;
use crate::shell::ChangeObserver;

pub use run::{EXIT_JS_LIMIT, EXIT_JS_THREW};

/// The backend's id.
pub const JS_BACKEND_ID: &str = "js";

/// The limits of one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsLimits {
    /// Memory of the JavaScript heap.
    pub memory_bytes_max: usize,
    /// Native stack the interpreter may use (deep recursion ends with a RangeError).
    pub stack_bytes_max: usize,
    /// Bytes the console writes, stdout and stderr together.
    pub output_bytes_max: usize,
    /// Bytes of the input and of the returned value, as JSON.
    pub input_bytes_max: usize,
    pub value_bytes_max: usize,
    /// Wall time (the spine's timeout, which interrupts the script); `None`: the
    /// caller's timeout alone.
    pub timeout: Option<Duration>,
}

impl Default for JsLimits {
    fn default() -> JsLimits {
        JsLimits {
            memory_bytes_max: 256 << 20,
            stack_bytes_max: 1 << 20,
            output_bytes_max: 16 << 20,
            input_bytes_max: 16 << 20,
            value_bytes_max: 16 << 20,
            timeout: None,
        }
    }
}

/// The `js` backend's policy.
#[derive(Clone, Debug, Default)]
pub struct JsPolicy {
    /// Bare module names a module may import besides `fs` (each then read from
    /// `/workspace/node_modules/NAME/index.js`, or `NAME.js` there).
    pub imports: Vec<String>,
    pub limits: JsLimits,
}

/// The `js` backend over one workspace.
pub struct JsBackend {
    shared: Arc<Shared>,
}

struct Shared {
    ws: Workspace,
    policy: JsPolicy,
    changed: Option<ChangeObserver>,
}

impl JsBackend {
    /// `changed` is told the paths each write of `fs` changed (a mount's kernel cache).
    pub fn new(ws: Workspace, policy: JsPolicy, changed: Option<ChangeObserver>) -> JsBackend {
        JsBackend {
            shared: Arc::new(Shared {
                ws,
                policy,
                changed,
            }),
        }
    }
}

impl Backend for JsBackend {
    fn id(&self) -> &str {
        JS_BACKEND_ID
    }

    fn describe(&self) -> Description {
        Description {
            id: JS_BACKEND_ID.into(),
            summary: "a JavaScript module run by QuickJS inside the daemon".into(),
            runs: "an ES module whose default export gets the JSON input and returns a JSON \
                   value; imports `fs` (promises) and relative modules"
                .into(),
            touches: format!(
                "the workspace at {SANDBOX_WORKSPACE} through `fs`; no network, no process"
            ),
        }
    }

    fn connect(&self) -> Result<Arc<dyn Connection>> {
        Ok(Arc::new(JsConnection {
            shared: self.shared.clone(),
        }))
    }

    fn can_run(&self, _script: &str) -> std::result::Result<(), String> {
        Err("a module for the js backend is run only when asked for by name".into())
    }
}

struct JsConnection {
    shared: Arc<Shared>,
}

impl Connection for JsConnection {
    fn before_exec(&self, _exec_id: &str) -> Result<()> {
        Ok(()) // `fs` works on the store itself
    }

    fn spawn(&self, request: &SpawnRequest) -> Result<Spawned> {
        let shared = &self.shared;
        let host = fs_module::FsHost::new(&shared.ws, &request.cwd, shared.changed.clone());
        run::start(host, &shared.policy, request)
    }

    fn after_exec(&self, _exec_id: &str) -> SyncOutcome {
        SyncOutcome::Complete // every write of `fs` was a store mutation when it returned
    }

    fn timeout_max(&self) -> Option<Duration> {
        self.shared.policy.limits.timeout
    }
}
