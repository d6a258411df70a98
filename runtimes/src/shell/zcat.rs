//! `zcat`, which bashkit lacks: the files named (or standard input) decompressed to
//! standard output, as `gunzip -c` gives them.

use std::io::Read;
use std::path::Path;

use bashkit::{async_trait, Builtin, BuiltinContext, ExecResult};

/// The `zcat` command of the shell.
pub(crate) struct Zcat;

#[async_trait]
impl Builtin for Zcat {
    async fn execute(&self, ctx: BuiltinContext<'_>) -> bashkit::Result<ExecResult> {
        let operands: Vec<&str> = (ctx.args.iter())
            .map(String::as_str)
            .filter(|arg| *arg == "-" || !arg.starts_with('-'))
            .collect();
        let operands = if operands.is_empty() {
            vec!["-"]
        } else {
            operands
        };
        let mut stdout = Vec::new();
        let mut stderr = String::new();
        for operand in operands {
            let compressed = if operand == "-" {
                ctx.stdin.map(|s| s.as_bytes().to_vec()).unwrap_or_default()
            } else {
                match ctx.fs.read_file(&ctx.cwd.join(Path::new(operand))).await {
                    Ok(bytes) => bytes,
                    Err(err) => {
                        stderr.push_str(&format!("zcat: {operand}: {err}\n"));
                        continue;
                    }
                }
            };
            let mut decoder = flate2::read::MultiGzDecoder::new(&compressed[..]);
            if decoder.read_to_end(&mut stdout).is_err() {
                stderr.push_str(&format!("zcat: {operand}: not in gzip format\n"));
            }
        }
        let code = i32::from(!stderr.is_empty());
        let mut result = ExecResult::with_code(stdout, code);
        result.stderr = stderr.into();
        Ok(result)
    }
}
