//! Small state files other layers keep in the data directory (the
//! engine's producer snapshot): storage owns every file there, so they are
//! written and read here, through the disk trait like everything else.
//!
//! A state file is replaced whole: the new contents go to a temporary
//! file, which is synced and renamed over the old one, and the directory
//! is synced; a crash at any point leaves the old contents or the new,
//! never a mix. A temporary file left by a crash is removed at the next
//! write.

use super::*;

/// The suffix of a state file being written.
const TMP_SUFFIX: &str = ".tmp";

impl Storage {
    /// Replaces the state file `name` (a plain file name) with `bytes`,
    /// durably. Refused once storage is poisoned: after a failed fsync
    /// nothing more is trusted to the disk.
    pub fn put_state(&self, name: &str, bytes: &[u8]) -> Result<(), StorageError> {
        self.check_poison()?;
        let disk = &*self.cfg.disk;
        let path = self.state_path(name)?;
        let tmp = self.data_dir.join(format!("{name}{TMP_SUFFIX}"));
        if disk.exists(&tmp) {
            disk.remove_file(&tmp).map_err(io_err(&tmp))?;
        }
        let f = disk.open(&tmp, Mode::CreateNew).map_err(open_err(&tmp))?;
        f.write_all_at(bytes, 0).and_then(|_| f.sync_data()).map_err(io_err(&tmp))?;
        drop(f);
        disk.rename(&tmp, &path).map_err(io_err(&path))?;
        sync_dir(disk, &self.data_dir)
    }

    /// The contents of the state file `name`; `None` if there is none.
    pub fn get_state(&self, name: &str) -> Result<Option<Vec<u8>>, StorageError> {
        self.state_path(name)?;
        read_state(&*self.cfg.disk, &self.data_dir, name)
    }

    /// A state file's path: a plain name in the data directory, never one
    /// of storage's own.
    fn state_path(&self, name: &str) -> Result<PathBuf, StorageError> {
        let own = [CLEAN_MARKER, "log", "stores"];
        let plain = !name.is_empty() && !name.contains('/') && name != "." && name != ".." && !name.ends_with(TMP_SUFFIX);
        if !plain || own.contains(&name) {
            return Err(StorageError::Io { path: name.to_owned(), source: io::Error::new(io::ErrorKind::InvalidInput, "not a state file name") });
        }
        Ok(self.data_dir.join(name))
    }
}

/// The framing storage's own small state files share: magic (8 bytes),
/// version (u16), a record count (u32), the records, and a crc32 (IEEE)
/// of everything before it. `framed` writes it around `records`;
/// `unframe` checks it and returns the count and the records' bytes.
pub(super) fn framed(magic: &[u8; 8], version: u16, count: u32, records: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(14 + records.len() + 4);
    out.extend_from_slice(magic);
    out.extend_from_slice(&version.to_be_bytes());
    out.extend_from_slice(&count.to_be_bytes());
    out.extend_from_slice(records);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

/// See [`framed`]; `what` names the file in the error.
pub(super) fn unframe<'a>(bytes: &'a [u8], magic: &[u8; 8], version: u16, what: &str) -> Result<(u32, &'a [u8]), String> {
    let body_len = bytes.len().checked_sub(4).filter(|&l| l >= 14).ok_or("too short")?;
    let (body, crc) = bytes.split_at(body_len);
    if crc32fast::hash(body) != u32::from_be_bytes(crc.try_into().expect("4 bytes")) {
        return Err("checksum mismatch".into());
    }
    if &body[..8] != magic {
        return Err(format!("not a {what}"));
    }
    let found = u16::from_be_bytes([body[8], body[9]]);
    if found != version {
        return Err(format!("unknown version {found}"));
    }
    Ok((u32::from_be_bytes(body[10..14].try_into().expect("4 bytes")), &body[14..]))
}

/// The state file `name` in `data_dir`, decoded; one that does not
/// decode is an error naming the file and why (storage's own state files
/// are replaced whole, so damage is the disk's).
pub(super) fn load_state<T>(disk: &dyn Disk, data_dir: &Path, name: &str, decode: impl FnOnce(&[u8]) -> Result<T, String>) -> Result<Option<T>, StorageError> {
    let Some(bytes) = read_state(disk, data_dir, name)? else { return Ok(None) };
    let bad = |why| StorageError::Io { path: data_dir.join(name).display().to_string(), source: io::Error::new(io::ErrorKind::InvalidData, why) };
    decode(&bytes).map(Some).map_err(bad)
}

/// The contents of the state file `name` in `data_dir` (also before
/// storage is open: recovery reads its own state files).
pub(super) fn read_state(disk: &dyn Disk, data_dir: &Path, name: &str) -> Result<Option<Vec<u8>>, StorageError> {
    let path = data_dir.join(name);
    if !disk.exists(&path) {
        return Ok(None);
    }
    let f = disk.open(&path, Mode::Read).map_err(open_err(&path))?;
    let len = f.len().map_err(io_err(&path))?;
    let mut buf = vec![0u8; usize::try_from(len).map_err(|_| StorageError::Io { path: path.display().to_string(), source: io::Error::other("too large") })?];
    f.read_exact_at(&mut buf, 0).map_err(io_err(&path))?;
    Ok(Some(buf))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::disk::sim::{Faults, SimDisk};

    fn open(disk: &SimDisk) -> (Arc<Storage>, LogWriter) {
        let cfg = StorageConfig { disk: Arc::new(disk.clone()), ..StorageConfig::default() };
        Storage::open(Path::new("/data"), cfg, vec![], true).unwrap()
    }

    #[test]
    fn a_state_file_is_the_old_or_the_new_contents_after_any_crash() {
        let (mut old_seen, mut new_seen) = (0, 0);
        for seed in 0..300 {
            let disk = SimDisk::new(seed, Faults::default());
            let (s, w) = open(&disk);
            assert_eq!(s.get_state("p.snapshot").unwrap(), None);
            s.put_state("p.snapshot", b"first").unwrap();
            // The replacement fails at a random step (a torn write, a
            // failed fsync, no descriptor) or succeeds; then the machine
            // crashes, losing whatever was not durable.
            disk.set_faults(Faults { write_eio: 300_000, sync_eio: 300_000, emfile: 200_000, ..Faults::default() });
            let r = s.put_state("p.snapshot", b"second, longer");
            let replaced = r.is_ok();
            drop((s, w));
            disk.set_faults(Faults::default());
            disk.crash();
            let (s, _w) = open(&disk);
            let got = s.get_state("p.snapshot").unwrap();
            let got = got.as_deref();
            assert!(got == Some(&b"first"[..]) || got == Some(&b"second, longer"[..]), "seed {seed}: {got:?}");
            if replaced {
                assert_eq!(got, Some(&b"second, longer"[..]), "seed {seed}: a replacement that succeeded was lost");
            }
            if got == Some(&b"first"[..]) { old_seen += 1 } else { new_seen += 1 }
        }
        assert!(old_seen > 0 && new_seen > 0, "the faults never (or always) stopped a replacement: {old_seen} old, {new_seen} new");
    }

    #[test]
    fn storage_files_are_not_state_files() {
        let disk = SimDisk::new(1, Faults::default());
        let (s, _w) = open(&disk);
        for name in ["", "log", "stores", CLEAN_MARKER, "../x", "a/b", "..", "x.tmp"] {
            assert!(s.put_state(name, b"x").is_err(), "{name:?}");
            assert!(s.get_state(name).is_err(), "{name:?}");
        }
    }
}
