//! The oplog entries of one transaction held until its outcome (a `partialTxn` chain waiting
//! for its last entry, a prepared transaction waiting for its commit), bounded in memory.
//!
//! Entries are kept as the raw documents the oplog holds, and turned into changes only when
//! the transaction commits. Up to `mongodb.max_held_bytes` (over every transaction held) they
//! stay in memory; past it, a transaction's entries go to a file of its own in
//! `mongodb.spill_dir`, written as the BSON documents one after another (each starts with its
//! length), read back in order at the commit and deleted then, or when the transaction is
//! dropped (aborted, or the reader starts again after a failure).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use mongodb::bson::raw::RawDocumentBuf;

/// One transaction's entries, in oplog order.
pub(crate) struct Held {
    mem: Vec<RawDocumentBuf>,
    mem_bytes: usize,
    spill: Option<Spill>,
    entries: usize,
}

pub(crate) struct Spill {
    path: PathBuf,
    writer: Option<BufWriter<File>>,
}

impl Drop for Spill {
    fn drop(&mut self) {
        self.writer = None;
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Where entries of transactions too large for memory go, and the bound.
#[derive(Clone)]
pub(crate) struct SpillConfig {
    pub(crate) dir: PathBuf,
    pub(crate) max_held_bytes: usize,
}

impl Held {
    pub(crate) fn new() -> Self {
        Self {
            mem: Vec::new(),
            mem_bytes: 0,
            spill: None,
            entries: 0,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries == 0
    }

    pub(crate) fn len(&self) -> usize {
        self.entries
    }

    /// Bytes held in memory.
    pub(crate) fn mem_bytes(&self) -> usize {
        self.mem_bytes
    }

    /// Whether its entries are in a file.
    #[cfg(test)]
    pub(crate) fn spilled(&self) -> bool {
        self.spill.is_some()
    }

    /// Add an entry; `held_elsewhere` is what other transactions hold in memory. Past the
    /// bound the entries so far, and every later one, go to the file.
    pub(crate) fn push(
        &mut self,
        entry: RawDocumentBuf,
        held_elsewhere: usize,
        config: &SpillConfig,
    ) -> std::io::Result<()> {
        self.entries += 1;
        if let Some(s) = self.spill.as_mut() {
            return s.write(&entry);
        }
        self.mem_bytes += entry.as_bytes().len();
        self.mem.push(entry);
        if self.mem_bytes + held_elsewhere > config.max_held_bytes {
            let mut s = Spill::create(&config.dir)?;
            tracing::info!(
                file = %s.path.display(),
                entries = self.mem.len(),
                bytes = self.mem_bytes,
                max_held_bytes = config.max_held_bytes,
                "a transaction held until its commit is larger than mongodb.max_held_bytes: its \
                 oplog entries go to a file until then"
            );
            for e in self.mem.drain(..) {
                s.write(&e)?;
            }
            self.mem_bytes = 0;
            self.spill = Some(s);
        }
        Ok(())
    }

    /// Every entry, in order (read back from the file where it spilled), the file deleted
    /// once read.
    pub(crate) fn drain(self) -> Entries {
        match self.spill {
            None => Entries::Mem(self.mem.into_iter()),
            Some(mut s) => {
                let reader = s
                    .writer
                    .take()
                    .map(|mut w| w.flush())
                    .transpose()
                    .and_then(|_| File::open(&s.path))
                    .map(BufReader::new);
                Entries::File {
                    reader: Some(reader),
                    left: self.entries,
                    _spill: s,
                }
            }
        }
    }
}

/// The counter in spill files' names.
static SPILL_SEQ: AtomicU64 = AtomicU64::new(0);

impl Spill {
    fn create(dir: &std::path::Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        // Never over an existing file: another capture sharing the folder (pid 1 in its
        // container too) or one a killed capture left.
        let (path, file) = loop {
            let path = dir.join(format!(
                "sluice-capture-mongo-{}-{}.bson",
                std::process::id(),
                SPILL_SEQ.fetch_add(1, Ordering::Relaxed)
            ));
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(f) => break (path, f),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        };
        Ok(Self {
            path,
            writer: Some(BufWriter::with_capacity(1 << 20, file)),
        })
    }

    fn write(&mut self, entry: &RawDocumentBuf) -> std::io::Result<()> {
        let w = self.writer.as_mut().expect("written before it is read");
        w.write_all(entry.as_bytes())
    }
}

/// The entries of a transaction, in order.
pub(crate) enum Entries {
    Mem(std::vec::IntoIter<RawDocumentBuf>),
    File {
        reader: Option<std::io::Result<BufReader<File>>>,
        left: usize,
        _spill: Spill,
    },
}

impl Iterator for Entries {
    type Item = Result<RawDocumentBuf, String>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Entries::Mem(it) => it.next().map(Ok),
            Entries::File {
                reader,
                left,
                _spill: spill,
            } => {
                if *left == 0 {
                    return None;
                }
                *left -= 1;
                let what = || format!("held oplog entries in {}", spill.path.display());
                let r = match reader.as_mut()? {
                    Ok(r) => r,
                    Err(e) => {
                        let e = format!("{}: {e}", what());
                        *reader = None;
                        return Some(Err(e));
                    }
                };
                let mut len = [0u8; 4];
                let read = r.read_exact(&mut len).and_then(|()| {
                    let n = i32::from_le_bytes(len);
                    let n = usize::try_from(n)
                        .ok()
                        .filter(|&n| n >= 5)
                        .ok_or_else(|| std::io::Error::other(format!("a length of {n}")))?;
                    let mut buf = vec![0u8; n];
                    buf[..4].copy_from_slice(&len);
                    r.read_exact(&mut buf[4..])?;
                    RawDocumentBuf::from_bytes(buf).map_err(std::io::Error::other)
                });
                Some(read.map_err(|e| format!("{}: {e}", what())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::rawdoc;

    fn entry(i: i32) -> RawDocumentBuf {
        rawdoc! { "ts": i, "o": { "_id": i, "pad": "x".repeat(100 + i as usize) } }
    }

    #[test]
    fn entries_stay_in_memory_up_to_the_bound_and_come_back_in_order_from_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let config = SpillConfig {
            dir: dir.path().to_path_buf(),
            max_held_bytes: 1000,
        };
        let mut small = Held::new();
        for i in 0..3 {
            small.push(entry(i), 0, &config).unwrap();
        }
        assert!(!small.spilled() && small.mem_bytes() < 1000);
        let back: Vec<_> = small.drain().map(Result::unwrap).collect();
        assert_eq!(back, (0..3).map(entry).collect::<Vec<_>>());

        let mut large = Held::new();
        for i in 0..50 {
            large.push(entry(i), 0, &config).unwrap();
            assert!(
                large.mem_bytes() <= 1000,
                "entry {i}: {}",
                large.mem_bytes()
            );
        }
        assert!(large.spilled() && large.mem_bytes() == 0 && large.len() == 50);
        let files = || std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(files(), 1);
        let back: Vec<_> = large.drain().map(Result::unwrap).collect();
        assert_eq!(back, (0..50).map(entry).collect::<Vec<_>>());
        assert_eq!(files(), 0, "the file goes once read");

        // What other transactions hold counts against the bound too; a dropped one leaves no
        // file behind.
        let mut other = Held::new();
        other.push(entry(1), 950, &config).unwrap();
        assert!(other.spilled());
        assert_eq!(files(), 1);
        drop(other);
        assert_eq!(files(), 0);
    }

    #[test]
    fn a_damaged_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let config = SpillConfig {
            dir: dir.path().to_path_buf(),
            max_held_bytes: 0,
        };
        let mut held = Held::new();
        held.push(entry(1), 0, &config).unwrap();
        held.push(entry(2), 0, &config).unwrap();
        let path = std::fs::read_dir(dir.path())
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let mut it = held.drain();
        // Cut the file after the first entry.
        let len = entry(1).as_bytes().len() as u64;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len + 3)
            .unwrap();
        assert_eq!(it.next().unwrap().unwrap(), entry(1));
        let e = it.next().unwrap().unwrap_err();
        assert!(e.contains(&path.display().to_string()), "{e}");
    }

    #[test]
    fn a_spill_file_never_opens_over_an_existing_one() {
        let dir = tempfile::tempdir().unwrap();
        let next = SPILL_SEQ.load(Ordering::Relaxed);
        let taken = dir.path().join(format!(
            "sluice-capture-mongo-{}-{next}.bson",
            std::process::id()
        ));
        std::fs::write(&taken, b"another capture's").unwrap();
        let spill = Spill::create(dir.path()).unwrap();
        assert_ne!(spill.path, taken);
        assert_eq!(std::fs::read(&taken).unwrap(), b"another capture's");
    }
}
