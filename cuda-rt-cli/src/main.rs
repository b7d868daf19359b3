//! `cuda-rt`: ask the machine what CUDA it has, draw a pool snapshot, measure cuda-rt
//! against the raw driver.
//!
//! - `cuda-rt info`: CuPy's `show_config()`: the driver and runtime versions, every
//!   library cuda-rt loads and where it was found (or the pip package that provides
//!   it), the devices and their key attributes, the kernel cache folder and its state.
//!   Without a GPU it says why and exits 0.
//! - `cuda-rt snapshot view FILE.json`: the timeline page of a pool snapshot or an
//!   allocation history (cuda-rt's or PyTorch's JSON), written beside the file.
//! - `cuda-rt bench`: the headline ratios against the raw driver, in about a minute.
//!   Without a GPU it says why and exits 0.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod info;
mod snapshot;

#[derive(Debug, Parser)]
#[command(
    name = "cuda-rt",
    version,
    about = "Ask the machine about CUDA, through cuda-rt"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Driver and runtime versions, every CUDA library found and where, the devices
    /// and their key attributes, the kernel cache (CuPy's show_config()).
    Info {
        /// For a missing library, every path tried and why it failed.
        #[arg(short, long)]
        verbose: bool,
    },
    /// Pool snapshots and allocation histories.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// cuda-rt against the raw driver: pool malloc+free, launch, event record and
    /// pinned copies, as ratios (about a minute on a GPU).
    Bench(bench::Options),
}

#[derive(Debug, Subcommand)]
enum SnapshotCommand {
    /// Writes the timeline page (self-contained HTML) of a snapshot or history file:
    /// `MemoryPool::snapshot(..).to_json()`, `HistoryHook::to_json()`,
    /// `cuda_rt_alloc.snapshot()`, or PyTorch's `torch.cuda.memory._snapshot()` saved
    /// as JSON. Prints the page's path.
    View {
        /// The JSON file.
        file: PathBuf,
        /// Where to write the page (default: beside the file, `.html` for `.json`).
        #[arg(short, long)]
        out: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info { verbose } => info::run(&mut std::io::stdout().lock(), verbose),
        Command::Snapshot(SnapshotCommand::View { file, out }) => snapshot::view(&file, out),
        Command::Bench(options) => bench::run(&options),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`cuda-rt info | head`): nothing more to say.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cuda-rt: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The first line of a multi-line reason (the loader's lists every path tried after a
/// colon: `info -v` shows them), without its trailing "; tried N paths:".
fn reason_line(reason: &impl std::fmt::Display) -> String {
    let text = reason.to_string();
    let first = text.lines().next().unwrap_or_default();
    match first.rfind("; tried ") {
        Some(i) if first.ends_with(':') => first[..i].to_owned(),
        _ => first.to_owned(),
    }
}

/// The command's errors: what failed, in words.
type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn a_reason_keeps_its_first_line_without_the_list() {
        let r = "CUDA driver (libcuda.so.1) not found (set CUDA_RT_LIBCUDA to its file or \
                 folder); tried 1 path:\n  libcuda.so.1: cannot open";
        assert_eq!(
            super::reason_line(&r),
            "CUDA driver (libcuda.so.1) not found (set CUDA_RT_LIBCUDA to its file or folder)"
        );
        assert_eq!(super::reason_line(&"no device"), "no device");
    }

    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
