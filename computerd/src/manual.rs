//! `computerd completions SHELL` and `computerd man`: shell completions and man pages,
//! generated from the same clap definitions that parse the command line, so they
//! never fall behind it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    shell: clap_complete::Shell,
}

#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Write a page per command into this directory (computerd.1, computerd-fs.1, ...)
    /// instead of printing computerd(1) to stdout.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Prints the completion script for `args.shell` (for example, for bash:
/// `computerd completions bash > /etc/bash_completion.d/computerd`).
pub fn completions(args: CompletionsArgs, mut cli: clap::Command) -> anyhow::Result<ExitCode> {
    let name = cli.get_name().to_owned();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cli, name, &mut script);
    print_out(&script)
}

/// Prints computerd(1), or writes every command's page into `args.dir`.
pub fn man(args: ManArgs, cli: clap::Command) -> anyhow::Result<ExitCode> {
    match args.dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("{}: cannot make the directory", dir.display()))?;
            clap_mangen::generate_to(cli, &dir)
                .with_context(|| format!("{}: cannot write the man pages", dir.display()))?;
        }
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(cli)
                .render(&mut page)
                .context("rendering the man page")?;
            return print_out(&page);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes `bytes` to stdout; a reader that stopped early (`| head`) is no error.
fn print_out(bytes: &[u8]) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(err).context("standard output")
        }
        _ => Ok(ExitCode::SUCCESS),
    }
}
