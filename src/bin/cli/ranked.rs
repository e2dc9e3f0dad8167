//! `trmask analyze --distributed mpi`: one rank of a data-parallel job.
use crate::{Common, Distributed};
use std::path::{Path, PathBuf};

#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub struct Paths<'a> {
    pub input: &'a [PathBuf],
    pub output: Option<&'a Path>,
    pub metrics: Option<&'a Path>,
}

/// `path` with `{rank}` replaced by `rank`; an error when several ranks would share it.
#[cfg(feature = "mpi")]
fn for_rank(path: &Path, rank: i32, size: i32, flag: &str) -> Result<PathBuf, trmask::Error> {
    let text = path.to_string_lossy();
    if size > 1 && !text.contains("{rank}") {
        return Err(trmask::Error::config(
            flag,
            format!("{text} must contain {{rank}} when {size} ranks share it"),
        ));
    }
    Ok(PathBuf::from(text.replace("{rank}", &rank.to_string())))
}

#[cfg(not(feature = "mpi"))]
pub fn analyze(_: Distributed, _: &Paths, _: &Common, _: bool) -> Result<(), trmask::Error> {
    Err(trmask::Error::config(
        "--distributed",
        "this trmask was built without MPI; rebuild with `cargo build --features mpi`",
    ))
}

#[cfg(feature = "mpi")]
pub fn analyze(
    kind: Distributed,
    paths: &Paths,
    common: &Common,
    all_metrics: bool,
) -> Result<(), trmask::Error> {
    use crate::{analyse_one, setup, subject};
    use mpi::traits::Communicator;
    let Distributed::Mpi = kind;
    if paths.input.len() != 1 {
        return Err(trmask::Error::config(
            "--distributed",
            "takes one INPUT pattern with {rank} (e.g. 'shard-{rank}.safetensors')",
        ));
    }
    let universe = mpi::initialize()
        .ok_or_else(|| trmask::Error::config("--distributed", "MPI could not be initialised"))?;
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size());
    let result = (|| -> Result<(), trmask::Error> {
        let ctx = setup(common)?;
        let input = for_rank(&paths.input[0], rank, size, "INPUT")?;
        let output = paths
            .output
            .map(|p| for_rank(p, rank, size, "--output"))
            .transpose()?;
        let metrics = if rank == 0 { paths.metrics } else { None };
        crate::check_outputs(
            std::slice::from_ref(&input),
            common.config.as_deref(),
            &[("--output", output.as_deref()), ("--metrics", metrics)],
        )?;
        let d = analyse_one(
            &ctx,
            (&input, false),
            common,
            &mut |batch| trmask::distributed::analyze(ctx.engine.as_ref(), batch, &ctx.cfg, &world),
            false,
        )?;
        // this rank's outputs all or nothing, like the single-process run
        let mut commit = trmask::io::Commit::new();
        let mut written = Vec::new();
        if let Some(p) = &output {
            commit.stage(p, trmask::io::outputs_bytes(p, &d.analysis.outputs)?)?;
            written.push(format!("{} (every rank its own)", p.display()));
        }
        if let Some(p) = metrics {
            commit.stage(p, trmask::io::metrics_bytes(&d.analysis.metrics)?)?;
            written.push(format!("{} (the whole batch)", p.display()));
        }
        if rank != 0 {
            return commit.finish();
        }
        let name = format!("{} (rank 0 of {size} MPI ranks)", input.display());
        let mut text = trmask::report::summary(&subject(&ctx, &name, &d, None), &written);
        text.push_str(&format!(
            "\nmetrics and certificate: the whole batch over {size} ranks; the sequences \
             listed: rank 0's shard"
        ));
        if all_metrics {
            for (key, v) in &d.analysis.metrics {
                text.push_str(&format!("\n{key:<48} {v:.6e}"));
            }
        }
        // printed with the files, before they are renamed into place (see analyze)
        commit.print(&text);
        commit.finish()
    })();
    if let Err(e) = &result {
        if size > 1 {
            // the other ranks may wait in a collective: end the whole job
            eprintln!("error: rank {rank}: {e}");
            world.abort(if e.is_user_error() { 2 } else { 1 });
        }
    }
    result
}
