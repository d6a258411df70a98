//! Probe for docs/evaluations/rmcp/README.md: an MCP server on stdio (rmcp 3.11.0) with
//! two tools, `echo` and `slow` (which reports progress). Logs go to stderr only: stdout
//! carries the JSON-RPC stream.

use std::time::Duration;

use rmcp::{
    handler::server::wrapper::{Json, Parameters},
    model::{ProgressNotificationParam, RequestMetaObject},
    tool, tool_handler, tool_router, ErrorData, Peer, RoleServer, ServerHandler, ServiceExt,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Arguments of `echo`.
#[derive(Deserialize, JsonSchema)]
struct EchoArgs {
    /// Text to send back.
    text: String,
    /// How many times to repeat it (default 1).
    #[serde(default)]
    times: Option<u32>,
}

/// Arguments of `slow`.
#[derive(Deserialize, JsonSchema)]
struct SlowArgs {
    /// Number of 100 ms steps.
    steps: u32,
}

#[derive(Serialize, JsonSchema)]
struct SlowResult {
    steps_done: u32,
    had_progress_token: bool,
}

#[derive(Clone)]
struct Probe;

#[tool_router]
impl Probe {
    /// Echo the text back.
    #[tool(annotations(read_only_hint = true))]
    async fn echo(&self, Parameters(args): Parameters<EchoArgs>) -> String {
        args.text.repeat(args.times.unwrap_or(1) as usize)
    }

    /// Work for `steps` x 100 ms, sending notifications/progress after each step when the
    /// request carried `_meta.progressToken`.
    #[tool]
    async fn slow(
        &self,
        Parameters(args): Parameters<SlowArgs>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> Result<Json<SlowResult>, ErrorData> {
        if args.steps > 50 {
            return Err(ErrorData::invalid_params("steps must be <= 50", None));
        }
        let token = meta.get_progress_token();
        eprintln!("[probe] slow: steps={} progressToken={:?}", args.steps, token);
        for i in 1..=args.steps {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if let Some(token) = &token {
                peer.notify_progress(
                    ProgressNotificationParam::new(token.clone(), i as f64)
                        .with_total(args.steps as f64)
                        .with_message(format!("step {i}/{}", args.steps)),
                )
                .await
                .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
            }
        }
        Ok(Json(SlowResult { steps_done: args.steps, had_progress_token: token.is_some() }))
    }
}

#[tool_handler(name = "rmcp-probe", version = "0.1.0", instructions = "probe server")]
impl ServerHandler for Probe {}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::args().nth(1).as_deref() == Some("--tools") {
        let tools = Probe::tool_router().list_all();
        println!("{}", serde_json::to_string_pretty(&tools)?);
        return Ok(());
    }
    eprintln!("[probe] serving on stdio");
    let service = Probe.serve(rmcp::transport::stdio()).await?;
    let reason = service.waiting().await?;
    eprintln!("[probe] stopped: {reason:?}");
    Ok(())
}
