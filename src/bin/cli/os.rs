//! What the CLI does to its own process: signal dispositions, the Vulkan loader's runtime
//! directory, and standard output that reports its failures.

use std::path::PathBuf;
use std::sync::Mutex;

/// The first failed write to standard output other than a closed pipe (`… | head` is fine,
/// `> /dev/full` is exit code 1).
static STDOUT_ERROR: Mutex<Option<String>> = Mutex::new(None);

/// Writes one line to standard output, remembering a failure for [`stdout_error`].
pub fn say(args: std::fmt::Arguments) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{args}").and_then(|_| out.flush()) {
        record(e);
    }
}

fn record(e: std::io::Error) {
    if e.kind() != std::io::ErrorKind::BrokenPipe {
        if let Ok(mut slot) = STDOUT_ERROR.lock() {
            slot.get_or_insert(e.to_string());
        }
    }
}

/// The recorded standard-output failure, after a final flush.
pub fn stdout_error() -> Option<String> {
    use std::io::Write as _;
    if let Err(e) = std::io::stdout().lock().flush() {
        record(e);
    }
    STDOUT_ERROR.lock().ok().and_then(|s| s.clone())
}

/// A file-size limit (`ulimit -f`) makes writes fail with EFBIG (exit code 1, outputs left as
/// they were) instead of killing the process with SIGXFSZ; an input truncated under its
/// memory map (SIGBUS) ends the process with one line and exit code 1. Outputs are staged only
/// after every input has been read, so no output exists at that point.
pub fn install_signal_handlers() {
    #[cfg(unix)]
    // SAFETY: called first thing in `main`, single-threaded; the handler only calls the
    // async-signal-safe `write` and `_exit`.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
}

#[cfg(unix)]
extern "C" fn on_sigbus(_: libc::c_int) {
    const MSG: &[u8] = b"trmask: an input file shrank while it was being read (rewritten by \
another process?); no output was written\n";
    // Several reader threads may fault on the same truncation at once: the first reports and
    // exits, the others wait for that exit (one line, not one per thread). A lock-free atomic
    // swap is async-signal-safe.
    static REPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if REPORTED.swap(true, std::sync::atomic::Ordering::SeqCst) {
        loop {
            // SAFETY: async-signal-safe; the reporting thread's `_exit` ends the process.
            unsafe { libc::pause() };
        }
    }
    // SAFETY: async-signal-safe calls only.
    unsafe {
        libc::write(2, MSG.as_ptr().cast(), MSG.len());
        libc::_exit(1);
    }
}

/// A private `XDG_RUNTIME_DIR` for the Vulkan loader, removed when dropped.
pub struct RuntimeDir(Option<PathBuf>);

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        if let Some(d) = &self.0 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Vulkan loaders print two error lines per instance when `XDG_RUNTIME_DIR` is unset (headless
/// boxes, CI). When it is unset and `gpu` says a GPU may be opened, a fresh directory is
/// created (`mkdtemp`-style: a new name, mode 0700 from the start, `mkdir` that fails on any
/// existing entry or symlink, so nothing planted is followed or reused) and removed at exit.
/// Must run before any thread exists.
pub fn runtime_dir(gpu: bool) -> RuntimeDir {
    if !gpu || std::env::var_os("XDG_RUNTIME_DIR").is_some() {
        return RuntimeDir(None);
    }
    let base = std::env::temp_dir();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    for attempt in 0..16u64 {
        let tag = seed.wrapping_mul(6364136223846793005).wrapping_add(attempt) >> 16;
        let dir = base.join(format!("trmask-xdg-{}-{tag:x}", std::process::id()));
        let mut b = std::fs::DirBuilder::new();
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt as _;
            b.mode(0o700);
        }
        match b.create(&dir) {
            Ok(()) => {
                // SAFETY: single-threaded at this point (see the caller).
                unsafe { std::env::set_var("XDG_RUNTIME_DIR", &dir) };
                return RuntimeDir(Some(dir));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(_) => break,
        }
    }
    RuntimeDir(None)
}

/// `--delta -1e-4`: clap takes `-1e-4` for a flag (it only knows plain negative numbers), so a
/// negative number in any notation after a numeric flag is glued to it (`--delta=-1e-4`).
pub fn glue_negative_numbers(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    const NUMERIC: [&str; 6] = [
        "--delta",
        "--eps",
        "--kl-seq",
        "--tv-seq",
        "--temperature",
        "--horizon",
    ];
    let mut out: Vec<std::ffi::OsString> = Vec::with_capacity(args.len());
    let mut it = args.into_iter().peekable();
    while let Some(a) = it.next() {
        let numeric_flag = a.to_str().is_some_and(|s| NUMERIC.contains(&s));
        let negative_next = it.peek().and_then(|n| n.to_str()).is_some_and(|n| {
            n.starts_with('-') && n.len() > 1 && n[1..].trim().parse::<f64>().is_ok()
        });
        if numeric_flag && negative_next {
            let mut glued = a;
            glued.push("=");
            glued.push(it.next().unwrap_or_default());
            out.push(glued);
        } else {
            out.push(a);
        }
    }
    out
}
