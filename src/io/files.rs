//! How trmask touches the file system: inputs are checked to be regular files and bounded in
//! size before they are read, outputs never alias an input (compared by device + inode, so
//! `./x/../y`, symlinks and hard links are caught), and the outputs of one run are written
//! all-or-nothing ([`Commit`]): each into a temporary file next to its target, `fsync`ed, and
//! renamed over the target only once every output of the run has been written.

use crate::error::{Error, Result};
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The largest JSON input trmask reads (256 MiB): a parsed JSON tree takes several times its
/// text, so a larger batch belongs in safetensors.
pub const JSON_LIMIT: u64 = 256 << 20;

/// What a path names, for the "same file?" test: an existing file's device and inode, or, for
/// a file yet to be created, its directory's device and inode plus its name.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Identity {
    File(u64, u64),
    Pending(u64, u64, std::ffi::OsString),
}

#[cfg(unix)]
fn dev_ino(m: &fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt as _;
    (m.dev(), m.ino())
}

#[cfg(not(unix))]
fn dev_ino(_: &fs::Metadata) -> (u64, u64) {
    (0, 0)
}

/// `(identity, is a regular file or not yet there)`; `None` when neither the file nor its
/// directory exists (the write will fail with its own message).
fn identity(path: &Path) -> Option<(Identity, bool)> {
    #[cfg(not(unix))]
    {
        let c = fs::canonicalize(path).ok()?;
        return Some((Identity::Pending(0, 0, c.into_os_string()), true));
    }
    #[cfg(unix)]
    {
        if let Ok(m) = fs::metadata(path) {
            let (d, i) = dev_ino(&m);
            return Some((Identity::File(d, i), m.is_file()));
        }
        let name = path.file_name()?.to_os_string();
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let m = fs::metadata(parent).ok()?;
        let (d, i) = dev_ino(&m);
        Some((Identity::Pending(d, i, name), true))
    }
}

/// Fails (exit code 2, naming the flag) when an output would overwrite an input or another
/// output: `inputs` and `outputs` are `(flag or role, path)`; `-` (stdout) is skipped, and so
/// are paths that name the same device file (`/dev/null` twice is fine).
pub fn check_distinct(inputs: &[(&str, &Path)], outputs: &[(&str, &Path)]) -> Result<()> {
    type Named = (String, PathBuf, Option<(Identity, bool)>);
    let ids = |list: &[(&str, &Path)]| -> Vec<Named> {
        list.iter()
            .filter(|(_, p)| p.as_os_str() != "-")
            .map(|(f, p)| (f.to_string(), p.to_path_buf(), identity(p)))
            .collect()
    };
    let ins = ids(inputs);
    let outs = ids(outputs);
    for (k, (flag, path, id)) in outs.iter().enumerate() {
        let Some((id, regular)) = id else { continue };
        if !regular {
            continue;
        }
        let clash = ins
            .iter()
            .chain(&outs[..k])
            .find(|(_, _, other)| other.as_ref().is_some_and(|(o, _)| o == id));
        if let Some((other_flag, other, _)) = clash {
            return Err(Error::config(
                flag.as_str(),
                format!(
                    "{} is the same file as {other_flag} {} (it would be overwritten); choose \
                     another path",
                    path.display(),
                    other.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Opens an input for reading after checking that it is a regular file (a directory, FIFO,
/// socket or device is refused, naming what it is; [`read_text`] reads FIFOs as streams);
/// returns the file and its size.
pub fn open_input(path: &Path) -> Result<(fs::File, u64)> {
    let p = path.display().to_string();
    let m = fs::metadata(path).map_err(|e| Error::io(&p, &e))?;
    if !m.is_file() {
        return Err(Error::file(
            &p,
            format!("is {}, not a regular file", file_kind(&m)),
        ));
    }
    let f = fs::File::open(path).map_err(|e| Error::io(&p, &e))?;
    Ok((f, m.len()))
}

fn file_kind(m: &fs::Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt as _;
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
    }
    "not a file"
}

/// Whether `path` is a stream to read as it comes: a FIFO, a process substitution
/// (`<(…)`, `/dev/fd/N`) or a piped `/dev/stdin`. A directory, socket, device or missing path
/// is not (opening it reports what it is).
pub fn is_stream(path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt as _;
        fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo())
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        false
    }
}

/// Reads a whole text input of at most `limit` bytes (checked before reading, and again while
/// reading in case the file grows). A stream ([`is_stream`]: a pipe, `<(…)`) is read as it
/// comes, up to the same limit; memory grows only with the bytes that arrive.
pub fn read_text(path: &Path, limit: u64) -> Result<String> {
    read_text_checked(path, limit, |_| Ok(()))
}

/// [`read_text`] with a check of the first bytes (up to 16) before the rest is read, so a
/// stream that is plainly not text is refused without reading it to the limit.
pub fn read_text_checked(
    path: &Path,
    limit: u64,
    head: impl Fn(&[u8]) -> Result<()>,
) -> Result<String> {
    use std::io::Read as _;
    let p = path.display().to_string();
    let (mut f, len) = if is_stream(path) {
        (fs::File::open(path).map_err(|e| Error::io(&p, &e))?, 0)
    } else {
        open_input(path)?
    };
    let too_big = || {
        Error::file(
            &p,
            format!(
                "is larger than the {limit}-byte limit for JSON inputs (write large batches as \
                 safetensors)"
            ),
        )
    };
    if len > limit {
        return Err(too_big());
    }
    let mut buf = Vec::new();
    buf.try_reserve_exact(len.max(16) as usize)
        .map_err(|_| Error::OutOfMemory(format!("{len} bytes to read {p}")))?;
    (&mut f)
        .take(16)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io(&p, &e))?;
    head(&buf)?;
    f.take(limit + 1 - buf.len() as u64)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io(&p, &e))?;
    if buf.len() as u64 > limit {
        return Err(too_big());
    }
    String::from_utf8(buf).map_err(|e| Error::file(&p, format!("not UTF-8 text: {e}")))
}

/// Reads a text file line by line from byte offset `from` (a file being appended to: one line
/// in memory at a time, whatever the file's size), calling `each(line_number, line)` with the
/// line's number counted from `first_line`. Only lines ending in a newline are read, unless
/// `tail` (the writer is done): then a last line without one is read too. At most `max`
/// lines are read per call. Returns the offset after the last line read, where the next call
/// starts. A line longer than [`JSON_LIMIT`] is an error naming it.
pub fn read_lines(
    path: &Path,
    (from, first_line): (u64, u64),
    tail: bool,
    max: u64,
    each: &mut dyn FnMut(u64, &str) -> Result<()>,
) -> Result<u64> {
    use std::io::{BufRead as _, Read as _, Seek as _};
    let p = path.display().to_string();
    let (mut f, _) = open_input(path)?;
    f.seek(std::io::SeekFrom::Start(from))
        .map_err(|e| Error::io(&p, &e))?;
    let mut r = std::io::BufReader::with_capacity(1 << 16, f).take(u64::MAX);
    let mut buf = Vec::new();
    let (mut at, mut n) = (from, first_line);
    while n - first_line < max {
        buf.clear();
        r.set_limit(JSON_LIMIT + 1);
        let got = r
            .read_until(b'\n', &mut buf)
            .map_err(|e| Error::io(&p, &e))?;
        if got == 0 {
            return Ok(at);
        }
        if got as u64 > JSON_LIMIT {
            return Err(Error::file(
                format!("{p}: line {n}"),
                format!("is longer than the {JSON_LIMIT}-byte limit"),
            ));
        }
        let complete = buf.last() == Some(&b'\n');
        if !complete && !tail {
            return Ok(at);
        }
        let text = std::str::from_utf8(&buf)
            .map_err(|e| Error::file(format!("{p}: line {n}"), format!("not UTF-8 text: {e}")))?;
        each(n, text.trim_end_matches(['\n', '\r']))?;
        at += got as u64;
        n += 1;
    }
    Ok(at)
}

/// The first non-blank line of a text file (at most [`JSON_LIMIT`] bytes read), `None` when
/// it has none.
pub fn first_line(path: &Path) -> Result<Option<String>> {
    use std::io::{BufRead as _, Read as _};
    let p = path.display().to_string();
    let (f, _) = open_input(path)?;
    let mut r = std::io::BufReader::new(f).take(JSON_LIMIT);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        if r.read_until(b'\n', &mut buf)
            .map_err(|e| Error::io(&p, &e))?
            == 0
        {
            return Ok(None);
        }
        let line = String::from_utf8_lossy(&buf);
        if !line.trim().is_empty() {
            return Ok(Some(line.into_owned()));
        }
    }
}

/// One output of a run, not yet visible under its name.
enum Action {
    /// A complete, `fsync`ed temporary file to rename over `target`.
    Rename { tmp: PathBuf, target: PathBuf },
    /// Bytes for a path that is not a regular file (`/dev/null`, a FIFO): written in place.
    Direct { target: PathBuf, bytes: Vec<u8> },
    /// Bytes for standard output; `quiet_pipe`: a closed pipe (`… | head`) is not a failure.
    Stdout { bytes: Vec<u8>, quiet_pipe: bool },
    /// Bytes appended to a JSON-lines file (truncated back if the run fails later).
    Append { target: PathBuf, bytes: Vec<u8> },
}

/// The outputs of one run, written all-or-nothing: [`Commit::stage`] writes each one to a
/// temporary file in its target directory (and `fsync`s it); [`Commit::finish`] renames them
/// into place once all are written. Dropping an unfinished `Commit` removes its temporary
/// files, so a failed run leaves every target as it was.
#[derive(Default)]
pub struct Commit {
    actions: Vec<Action>,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Where a write to `path` lands: the target of a symlink (so the link keeps pointing at the
/// new content), else `path`.
fn resolve(path: &Path) -> PathBuf {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => fs::canonicalize(path).unwrap_or(path.into()),
        _ => path.to_path_buf(),
    }
}

impl Commit {
    /// An empty set of outputs.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stages `bytes` for `path` (`-`: standard output).
    pub fn stage(&mut self, path: &Path, bytes: Vec<u8>) -> Result<()> {
        if path.as_os_str() == "-" {
            self.actions.push(Action::Stdout {
                bytes,
                quiet_pipe: false,
            });
            return Ok(());
        }
        let target = resolve(path);
        if fs::metadata(&target).is_ok_and(|m| !m.is_file()) {
            self.actions.push(Action::Direct { target, bytes });
            return Ok(());
        }
        let p = path.display().to_string();
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = target
            .file_name()
            .ok_or_else(|| Error::file(&p, "is not a file name"))?
            .to_string_lossy()
            .into_owned();
        let tmp = dir.join(format!(
            ".{name}.{}.{}.trmask-tmp",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| Error::io(&p, &e))?;
        // From here on, a failure must remove the temporary file: record it first.
        self.actions.push(Action::Rename {
            tmp: tmp.clone(),
            target,
        });
        f.write_all(&bytes)
            .and_then(|_| f.sync_all())
            .map_err(|e| Error::io(&p, &e))
    }

    /// Stages the text a run prints on standard output (its summary, "wrote …"): written with
    /// the other outputs and before any rename, so a failed write (`> /dev/full`) leaves no
    /// output committed. A closed pipe (`… | head`) is not a failure.
    pub fn print(&mut self, text: &str) {
        let mut bytes = text.as_bytes().to_vec();
        if !bytes.ends_with(b"\n") {
            bytes.push(b'\n');
        }
        self.actions.push(Action::Stdout {
            bytes,
            quiet_pipe: true,
        });
    }

    /// Stages one line to append to a JSON-lines file.
    pub fn append(&mut self, path: &Path, bytes: Vec<u8>) {
        for a in &mut self.actions {
            if let Action::Append { target, bytes: b } = a {
                if target == path {
                    b.extend_from_slice(&bytes);
                    return;
                }
            }
        }
        self.actions.push(Action::Append {
            target: path.to_path_buf(),
            bytes,
        });
    }

    /// Makes every staged output visible: appends, in-place writes and standard output first
    /// (the steps that can still fail; on failure the appended files are cut back and nothing
    /// is renamed), then the renames.
    pub fn finish(mut self) -> Result<()> {
        let actions = std::mem::take(&mut self.actions);
        let mut appended: Vec<(PathBuf, u64)> = Vec::new();
        let mut renames = Vec::new();
        let mut result = Ok(());
        for a in actions {
            if result.is_err() {
                if let Action::Rename { tmp, .. } = a {
                    let _ = fs::remove_file(tmp);
                }
                continue;
            }
            result = match a {
                Action::Rename { tmp, target } => {
                    renames.push((tmp, target));
                    Ok(())
                }
                Action::Direct { target, bytes } => {
                    let p = target.display().to_string();
                    fs::write(&target, bytes).map_err(|e| Error::io(&p, &e))
                }
                Action::Stdout { bytes, quiet_pipe } => {
                    let mut out = std::io::stdout().lock();
                    match out.write_all(&bytes).and_then(|_| out.flush()) {
                        Err(e) if quiet_pipe && e.kind() == std::io::ErrorKind::BrokenPipe => {
                            Ok(())
                        }
                        r => r.map_err(|e| Error::io("<stdout>", &e)),
                    }
                }
                Action::Append { target, bytes } => append(&target, &bytes, &mut appended),
            };
        }
        if result.is_ok() {
            for (k, (tmp, target)) in renames.iter().enumerate() {
                if let Err(e) = fs::rename(tmp, target) {
                    result = Err(Error::io(target.display().to_string(), &e));
                    for (t, _) in &renames[k..] {
                        let _ = fs::remove_file(t);
                    }
                    break;
                }
                sync_dir(target);
            }
        } else {
            for (tmp, _) in &renames {
                let _ = fs::remove_file(tmp);
            }
        }
        if result.is_err() {
            for (path, len) in appended {
                if let Ok(f) = fs::OpenOptions::new().write(true).open(&path) {
                    let _ = f.set_len(len);
                }
            }
        }
        result
    }
}

fn append(path: &Path, bytes: &[u8], done: &mut Vec<(PathBuf, u64)>) -> Result<()> {
    use std::io::{Read as _, Seek as _};
    let p = path.display().to_string();
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io(&p, &e))?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let is_file = f.metadata().is_ok_and(|m| m.is_file());
    if is_file {
        done.push((path.to_path_buf(), len));
    }
    // A file whose last line lacks its newline (a writer killed mid-line, an editor) gets
    // one first: the appended line starts a line of its own instead of gluing onto that one.
    let unterminated = is_file
        && len > 0
        && fs::File::open(path)
            .and_then(|mut r| {
                r.seek(std::io::SeekFrom::Start(len - 1))?;
                let mut last = [0u8; 1];
                r.read_exact(&mut last)?;
                Ok(last[0] != b'\n')
            })
            .unwrap_or(false);
    let r = (if unterminated {
        f.write_all(b"\n")
    } else {
        Ok(())
    })
    .and_then(|_| f.write_all(bytes))
    .and_then(|_| if is_file { f.sync_all() } else { Ok(()) });
    r.map_err(|e| Error::io(&p, &e))
}

/// `fsync` of the directory holding `path`, so the rename itself survives a crash (best
/// effort: not every file system allows it).
fn sync_dir(path: &Path) {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

impl Drop for Commit {
    fn drop(&mut self) {
        for a in &self.actions {
            if let Action::Rename { tmp, .. } = a {
                let _ = fs::remove_file(tmp);
            }
        }
    }
}
