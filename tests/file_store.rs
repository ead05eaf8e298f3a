//! File-store specifics: keys never escape the directory, a torn write
//! falls back to the previous record, corrupt and truncated records are
//! reported (naming the file) and left alone, store time survives a reboot
//! and runs on the machine's boot clock, jobs are refused clearly, a forked
//! child cannot use the store, a network filesystem is refused, and durable
//! mode syncs once per acquire + release pair without a crash ever losing
//! a token or the record.

#![allow(clippy::disallowed_types)] // the tests read and write record files

use leasehold::core;
use leasehold::store::file::encode_key;
use leasehold::{
    Client, Error, FileOptions, FileStore, Holder, HolderId, JobSpec, ManualClock, StoreExt,
};
use std::sync::Arc;
use std::time::Duration;

#[path = "support/dir.rs"]
mod dir;
use dir::Dir;

fn opts(clock: &ManualClock, boot: &str) -> FileOptions {
    FileOptions {
        clock: Some(Arc::new(clock.clone())),
        boot_id: Some(boot.into()),
        ..FileOptions::default()
    }
}

fn acquire(store: &FileStore, key: &str, h: u128, ttl: u64) -> leasehold::Result<u64> {
    let holder = Holder::new(HolderId(h));
    store
        .txn(|tx| core::lease::acquire(tx, key, &holder, ttl, 1))
        .map(|g| g.token)
}

#[test]
fn hostile_keys_stay_inside_the_directory() {
    let d = Dir::new("keys");
    let store = FileStore::open(d.leases()).unwrap();
    let long = "k/".repeat(500);
    let keys = [
        "../x",
        "/etc/passwd",
        "a/b/../../c",
        ".",
        "..",
        "ключ 🔒",
        "%2F",
        long.as_str(),
    ];
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(
            acquire(&store, key, i as u128 + 1, 10_000).unwrap(),
            1,
            "{key:?}"
        );
    }
    // Everything written is a plain file directly in the directory.
    for entry in std::fs::read_dir(d.leases()).unwrap() {
        let entry = entry.unwrap();
        assert!(entry.file_type().unwrap().is_file(), "{:?}", entry.path());
        let name = entry.file_name().into_string().unwrap();
        assert!(!name.contains('/') && name.len() < 255, "{name}");
    }
    assert!(!d.0.join("x.lease").exists() && !d.0.join("x").exists());
    // Distinct keys, distinct files, even past the length cut.
    let a = format!("{long}a");
    let b = format!("{long}b");
    assert_ne!(encode_key(&a), encode_key(&b));
    assert_eq!(encode_key("%2F"), "%252F");
    assert_ne!(encode_key("/"), encode_key("%2F"));
}

#[test]
fn a_torn_write_falls_back_to_the_previous_record() {
    let d = Dir::new("torn");
    let store = FileStore::open(d.leases()).unwrap();
    let holder = Holder::new(HolderId(1));
    let g = store
        .txn(|tx| core::lease::acquire(tx, "k", &holder, 10_000, 1))
        .unwrap();
    store
        .txn(|tx| core::lease::release(tx, "k", HolderId(1), g.token))
        .unwrap();
    // The release went to the second slot (16 MiB in). Tear it.
    let path = store.record_path("k");
    let mut bytes = std::fs::read(&path).unwrap();
    let second = 16 << 20;
    assert!(bytes.len() > second, "two slots");
    let end = bytes.len();
    for b in &mut bytes[second + 30..end] {
        *b = b'#';
    }
    std::fs::write(&path, &bytes).unwrap();
    // The previous record (held by 1, token 1) is in force again: the
    // write that was torn never returned success to anyone.
    let info = store.txn(|tx| core::lease::inspect(tx, "k")).unwrap();
    assert_eq!((info.last_token, info.holders.len()), (1, 1));
    // The next write goes to the torn slot and repairs it.
    store
        .txn(|tx| core::lease::release(tx, "k", HolderId(1), g.token))
        .unwrap();
    assert_eq!(acquire(&store, "k", 2, 10_000).unwrap(), 2);
}

#[test]
fn corrupt_and_truncated_records_are_reported_and_left_alone() {
    let d = Dir::new("corrupt");
    let store = FileStore::open(d.leases()).unwrap();
    acquire(&store, "k", 1, 10_000).unwrap();
    let path = store.record_path("k");
    let good = std::fs::read(&path).unwrap();
    for bad in [
        // The record cut short (the file also holds the durable watermark
        // further on, so cut inside the record itself).
        good[..64].to_vec(),
        good.iter()
            .map(|&b| if b == b'1' { b'2' } else { b })
            .collect(),
        b"\0\0\0\0garbage".to_vec(),
    ] {
        std::fs::write(&path, &bad).unwrap();
        let e = acquire(&store, "k", 2, 10_000).unwrap_err();
        assert!(matches!(e, Error::Store { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains(&path.display().to_string()),
            "names the file: {text}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), bad, "left as it was");
    }
    std::fs::write(&path, &good).unwrap();
    assert!(matches!(
        acquire(&store, "k", 2, 10_000),
        Err(Error::Held { .. })
    ));
}

#[test]
fn jobs_are_refused_clearly() {
    let d = Dir::new("jobs");
    let client = Client::new(FileStore::open(d.leases()).unwrap());
    let e = client
        .queue("q")
        .unwrap()
        .push(&JobSpec::new("x"))
        .unwrap_err();
    assert!(e.to_string().contains("leases only"), "{e}");
}

#[test]
fn store_time_continues_across_a_reboot_and_tokens_survive() {
    let d = Dir::new("reboot");
    let clock = ManualClock::new(90_000_000);
    let store = FileStore::open_with(d.leases(), opts(&clock, "boot-a")).unwrap();
    assert_eq!(acquire(&store, "k", 1, 5_000).unwrap(), 1);
    clock.advance(2_000);
    acquire(&store, "other", 1, 5_000).unwrap();
    drop(store);
    let clock = ManualClock::new(3);
    let store = FileStore::open_with(d.leases(), opts(&clock, "boot-b")).unwrap();
    assert!(matches!(
        acquire(&store, "k", 2, 100),
        Err(Error::Held { .. })
    ));
    clock.advance(5_000);
    assert_eq!(
        acquire(&store, "k", 2, 100).unwrap(),
        2,
        "the counter survived"
    );
}

#[test]
fn non_durable_mode_works_the_same() {
    let d = Dir::new("fast");
    let store = FileStore::open_with(
        d.leases(),
        FileOptions {
            durable: false,
            ..FileOptions::default()
        },
    )
    .unwrap();
    let client = Client::new(store);
    let g = client.try_acquire("k", Duration::from_secs(5)).unwrap();
    assert_eq!(g.token(), 1);
    g.release().unwrap();
    assert_eq!(
        client
            .try_acquire("k", Duration::from_secs(5))
            .unwrap()
            .token(),
        2
    );
}

#[test]
fn a_file_that_is_not_a_directory_is_refused() {
    let d = Dir::new("notdir");
    std::fs::create_dir_all(&d.0).unwrap();
    let file = d.0.join("plain");
    std::fs::write(&file, b"x").unwrap();
    let e = FileStore::open(&file).unwrap_err();
    assert!(e.to_string().contains("plain"), "{e}");
}

#[test]
fn forked_child_cannot_use_the_store() {
    let d = Dir::new("fork");
    let client = Client::new(FileStore::open(d.leases()).unwrap());
    let guard = client.try_acquire("k", Duration::from_secs(30)).unwrap();
    // SAFETY: the child only calls leasehold on inherited memory, then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let ok = matches!(guard.renew(), Err(Error::Forked { .. }))
            && matches!(client.inspect("k"), Err(Error::Forked { .. }));
        drop(guard);
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert_eq!(libc::WEXITSTATUS(status), 0);
    assert_eq!(client.inspect("k").unwrap().holders[0].token, guard.token());
    guard.release().unwrap();
}

/// A record written by an older leasehold (v1: no limit line) is read, and
/// the next write upgrades it.
#[test]
fn version_1_records_are_read_and_upgraded() {
    let d = Dir::new("v1");
    let clock = ManualClock::new(1_000);
    let store = FileStore::open_with(d.leases(), opts(&clock, "b")).unwrap();
    assert_eq!(acquire(&store, "k", 1, 100).unwrap(), 1);
    let path = store.record_path("k");
    // Rewrite the record in the v1 format: both slots hold it.
    let key_hex: String = b"k".iter().map(|b| format!("{b:02x}")).collect();
    let body = format!(
        "leasehold-lease v1\nkey {key_hex}\nlast_token 7\nslot 7 00000000-0000-0000-0000-000000000001 1100 -\n"
    );
    let fnv = |bytes: &[u8]| {
        bytes.iter().fold(0xCBF2_9CE4_8422_2325_u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3)
        })
    };
    let text = format!("{body}checksum {:016x}\n", fnv(body.as_bytes()));
    let mut slot = Vec::new();
    slot.extend_from_slice(b"LHS1");
    slot.extend_from_slice(&99u64.to_le_bytes());
    slot.extend_from_slice(&(text.len() as u32).to_le_bytes());
    slot.extend_from_slice(&fnv(text.as_bytes()).to_le_bytes());
    slot.extend_from_slice(text.as_bytes());
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(0).unwrap();
    f.write_all(&slot).unwrap();
    f.seek(SeekFrom::Start(16 << 20)).unwrap();
    f.write_all(&slot).unwrap();
    drop(f);
    let info = store.txn(|tx| core::lease::inspect(tx, "k")).unwrap();
    assert_eq!((info.last_token, info.limit, info.holders.len()), (7, 0, 1));
    clock.set(1_200);
    assert_eq!(acquire(&store, "k", 2, 100).unwrap(), 8, "tokens go on");
    let text = std::fs::read(&path).unwrap();
    assert!(String::from_utf8_lossy(&text).contains("leasehold-lease v2"));
    assert_eq!(
        store.txn(|tx| core::lease::inspect(tx, "k")).unwrap().limit,
        1
    );
}

/// The boot-clock rule: an instant handed out less than the persistence
/// interval (1 s) after the last persisted high water is still below store
/// time after a reboot.
#[test]
fn store_time_after_a_reboot_is_above_every_instant_handed_out() {
    let d = Dir::new("reboot-interval");
    let clock = ManualClock::new(90_000_000);
    let store = FileStore::open_with(d.leases(), opts(&clock, "boot-a")).unwrap();
    assert_eq!(store.txn(|tx| Ok(tx.now_ms())).unwrap(), 90_000_000);
    clock.advance(999);
    assert_eq!(acquire(&store, "k", 1, 100).unwrap(), 1);
    let last = store.txn(|tx| Ok(tx.now_ms())).unwrap();
    assert_eq!(last, 90_000_999);
    drop(store);
    let clock = ManualClock::new(3);
    let store = FileStore::open_with(d.leases(), opts(&clock, "boot-b")).unwrap();
    let first = store.txn(|tx| Ok(tx.now_ms())).unwrap();
    assert!(
        first > last,
        "store time went back across the reboot: {last} -> {first}"
    );
}

/// A fresh directory opened with default options runs on the boot-time
/// clock (not the wall clock, not a per-process monotonic clock).
#[test]
fn default_store_time_is_the_machines_boot_clock() {
    let d = Dir::new("bootclock");
    let store = FileStore::open(d.leases()).unwrap();
    let boot_ms = || {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid, writable timespec.
        assert_eq!(
            unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) },
            0
        );
        ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
    };
    let before = boot_ms();
    let now = store.txn(|tx| Ok(tx.now_ms())).unwrap();
    let after = boot_ms();
    assert!(
        now + 2_000 >= before && now <= after + 2_000,
        "store time {now} ms, boot clock {before}..{after} ms"
    );
}

/// A directory on NFS is refused, naming the filesystem and the directory,
/// and nothing is created (neither the directory nor anything in it);
/// `allow_network_fs` opens it anyway.
#[test]
fn a_network_filesystem_is_refused_unless_allowed() {
    let d = Dir::new("nfs");
    let nfs = FileOptions {
        statfs_magic: Some(0x6969),
        ..FileOptions::default()
    };
    let e = FileStore::open_with(d.leases(), nfs.clone()).unwrap_err();
    assert!(matches!(e, Error::Store { .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("NFS"), "names the filesystem: {text}");
    assert!(
        text.contains(&d.leases().display().to_string()),
        "names the directory: {text}"
    );
    assert!(!d.leases().exists(), "the directory was created");
    std::fs::create_dir(d.leases()).unwrap();
    assert!(FileStore::open_with(d.leases(), nfs.clone()).is_err());
    let created: Vec<_> = std::fs::read_dir(d.leases()).unwrap().collect();
    assert!(created.is_empty(), "created {created:?}");
    let allowed = FileOptions {
        allow_network_fs: true,
        ..nfs
    };
    let store = FileStore::open_with(d.leases(), allowed).unwrap();
    assert_eq!(acquire(&store, "k", 1, 1_000).unwrap(), 1);
}

/// Durable mode syncs grants and renewals, not releases: an acquire +
/// release pair costs one `fdatasync`.
#[test]
fn durable_acquire_and_release_sync_once_per_pair() {
    let d = Dir::new("syncs");
    let clock = ManualClock::new(1_000);
    let store = FileStore::open_with(d.leases(), opts(&clock, "b")).unwrap();
    let holder = Holder::new(HolderId(1));
    for pair in 1..=5 {
        let g = store
            .txn(|tx| core::lease::acquire(tx, "k", &holder, 10_000, 1))
            .unwrap();
        assert_eq!(store.record_syncs(), pair, "the grant is synced");
        store
            .txn(|tx| core::lease::release(tx, "k", HolderId(1), g.token))
            .unwrap();
        assert_eq!(store.record_syncs(), pair, "the release is not");
    }
    let g = store
        .txn(|tx| core::lease::acquire(tx, "k", &holder, 10_000, 1))
        .unwrap();
    clock.advance(10);
    store
        .txn(|tx| core::lease::renew(tx, "k", HolderId(1), g.token, 10_000))
        .unwrap();
    assert_eq!(store.record_syncs(), 7, "a renewal is synced");
    // Not durable: no syncs at all.
    let fast = FileStore::open_with(
        d.0.join("fast"),
        FileOptions {
            durable: false,
            ..opts(&clock, "b")
        },
    )
    .unwrap();
    let g = fast
        .txn(|tx| core::lease::acquire(tx, "k", &holder, 10_000, 1))
        .unwrap();
    fast.txn(|tx| core::lease::release(tx, "k", HolderId(1), g.token))
        .unwrap();
    assert_eq!(fast.record_syncs(), 0);
}

/// The parts of a record file a write touches: slot 0, the durable
/// watermark (the 16 bytes before slot 1), slot 1.
const REGIONS: [(u64, usize); 3] = [(0, 4096), ((16 << 20) - 16, 16), (16 << 20, 4096)];

type Image = [Vec<u8>; 3];

fn read_image(path: &std::path::Path) -> Image {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).unwrap();
    REGIONS.map(|(at, len)| {
        let mut buf = vec![0u8; len];
        let mut done = 0;
        while done < len {
            match f.read_at(&mut buf[done..], at + done as u64).unwrap() {
                0 => break,
                n => done += n,
            }
        }
        buf
    })
}

/// A region as a crash may leave it: 0 the old bytes, 1 the new, 2 the
/// new then the old (torn), 3 the old then the new (torn), torn inside the
/// slot header's checksum or the watermark's sequence number.
fn mixed(old: &[u8], new: &[u8], how: usize) -> Vec<u8> {
    let half = if old.len() == 16 { 4 } else { 20 };
    match how {
        0 => old.to_vec(),
        1 => new.to_vec(),
        2 => [&new[..half], &old[half..]].concat(),
        _ => [&old[..half], &new[half..]].concat(),
    }
}

/// Every image a crash between `old` and `new` may leave on disk, each
/// region independently.
fn crash_images(old: &Image, new: &Image) -> Vec<Image> {
    let mut out = Vec::new();
    for n in 0..64 {
        let how = [n % 4, n / 4 % 4, n / 16];
        out.push([0, 1, 2].map(|r| mixed(&old[r], &new[r], how[r])));
    }
    out
}

/// The record file `image` opens as a valid record whose token counter is
/// at least `tokens_out` (every token handed out), and the next grant is
/// above it.
fn recovers(d: &Dir, image: &Image, tokens_out: u64, what: &str) {
    recovers_if(d, image, tokens_out, true, what)
}

/// As [`recovers`]; unless `written` (no write had completed yet), the
/// file may also read as corrupt (reported, never reset).
fn recovers_if(d: &Dir, image: &Image, tokens_out: u64, written: bool, what: &str) {
    use std::os::unix::fs::FileExt;
    let dir = d.0.join("recovered");
    let _ = std::fs::remove_dir_all(&dir);
    let clock = ManualClock::new(1_000);
    let reader = FileOptions {
        durable: false,
        ..opts(&clock, "after")
    };
    let store = FileStore::open_with(&dir, reader).unwrap();
    let f = std::fs::File::create(store.record_path("k")).unwrap();
    for ((at, _), bytes) in REGIONS.iter().zip(image) {
        f.write_all_at(bytes, *at).unwrap();
    }
    drop(f);
    let info = match store.txn(|tx| core::lease::inspect(tx, "k")) {
        Ok(info) => info,
        Err(e) if !written && e.to_string().contains("no valid record slot") => return,
        Err(e) => panic!("{what}: {e}"),
    };
    assert!(
        info.last_token >= tokens_out,
        "{what}: token counter {} below {tokens_out} handed out",
        info.last_token
    );
    clock.advance(1_000_000);
    let next = acquire(&store, "k", 99, 100).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(next > tokens_out, "{what}: token {next} handed out again");
}

/// Crash consistency of durable mode's skipped syncs: in and after every
/// step of a run of grants, renewals and releases (a counting lease, two
/// holders), every image a power loss may leave (each region as of the
/// last `fdatasync`, as written since, or torn between) and every image a
/// process killed in the middle of the step's write may leave reads back
/// as a valid record (once a first write completed) that has every token
/// handed out before.
#[test]
fn skipped_syncs_never_lose_a_token_or_the_record() {
    let d = Dir::new("crash");
    let clock = ManualClock::new(1_000);
    let store = FileStore::open_with(d.leases(), opts(&clock, "b")).unwrap();
    let path = store.record_path("k");
    let (a, b) = (Holder::new(HolderId(1)), Holder::new(HolderId(2)));
    let blank: Image = REGIONS.map(|(_, len)| vec![0u8; len]);
    let (mut on_disk, mut tokens_out) = (blank.clone(), 0);
    let mut held = [0u64; 2];
    let steps = [
        "acquire a",
        "acquire b",
        "renew a",
        "release b",
        "release a",
        "acquire b",
        "renew b",
        "release b",
        "acquire a",
        "acquire b",
        "release a",
        "release b",
        "acquire a",
        "release a",
    ];
    for (i, step) in steps.iter().enumerate() {
        let before = if i == 0 {
            blank.clone()
        } else {
            read_image(&path)
        };
        let syncs = store.record_syncs();
        clock.advance(5);
        let (who, h) = if step.ends_with('a') {
            (0, &a)
        } else {
            (1, &b)
        };
        let granted = match &step[..step.len() - 2] {
            "acquire" => {
                let g = store.txn(|tx| core::lease::acquire(tx, "k", h, 60_000, 2));
                held[who] = g.unwrap().token;
                true
            }
            "renew" => {
                let t = held[who];
                store
                    .txn(|tx| core::lease::renew(tx, "k", h.id, t, 60_000))
                    .unwrap();
                true
            }
            _ => {
                let t = held[who];
                store
                    .txn(|tx| core::lease::release(tx, "k", h.id, t))
                    .unwrap();
                false
            }
        };
        let after = read_image(&path);
        let synced = store.record_syncs() - syncs;
        // Synced before writing (no watermark to trust yet).
        let synced_first = synced > u64::from(granted);
        // Killed in the middle of this step's writes, or the power lost
        // before its fdatasync returned: nothing of it was handed out yet.
        for (n, image) in crash_images(&before, &after).iter().enumerate() {
            let what = format!("kill in step {i} ({step}), image {n}");
            recovers_if(&d, image, tokens_out, i > 0, &what);
        }
        let was_on_disk = if synced_first { &before } else { &on_disk };
        for (n, image) in crash_images(was_on_disk, &after).iter().enumerate() {
            let what = format!("power loss in step {i} ({step}), image {n}");
            recovers_if(&d, image, tokens_out, i > 0, &what);
        }
        if granted {
            on_disk = after.clone();
        } else if synced_first {
            on_disk = before.clone();
        }
        tokens_out = tokens_out.max(held[0]).max(held[1]);
        // Power lost after this step: each region as on disk, as written
        // since, or torn between.
        for (n, image) in crash_images(&on_disk, &after).iter().enumerate() {
            let what = format!("power loss after step {i} ({step}), image {n}");
            recovers(&d, image, tokens_out, &what);
        }
    }
    assert!(
        store.record_syncs() < steps.len() as u64,
        "releases skip the sync"
    );
}

/// A record longer than one read (a counting lease with many labelled
/// holders) round-trips through both slots and a reopen.
#[test]
fn long_records_round_trip() {
    let d = Dir::new("long");
    let clock = ManualClock::new(1_000);
    let store = FileStore::open_with(d.leases(), opts(&clock, "b")).unwrap();
    let label = "l".repeat(60);
    for h in 1..=100u128 {
        let holder = Holder::with_label(HolderId(h), &label).unwrap();
        store
            .txn(|tx| core::lease::acquire(tx, "k", &holder, 60_000, 100))
            .unwrap();
    }
    assert!(std::fs::read(store.record_path("k")).unwrap().len() > 16 << 20);
    store
        .txn(|tx| core::lease::release(tx, "k", HolderId(7), 7))
        .unwrap();
    drop(store);
    let store = FileStore::open_with(d.leases(), opts(&clock, "b")).unwrap();
    let info = store.txn(|tx| core::lease::inspect(tx, "k")).unwrap();
    assert_eq!((info.last_token, info.holders.len()), (100, 99));
    assert!(info
        .holders
        .iter()
        .all(|h| h.holder.label.as_deref() == Some(&label[..])));
}

/// A write torn at every byte boundary (the slot image written up to that
/// byte, the rest as it was), with the watermark as before or as after,
/// and a watermark torn at every byte: the record reads back as exactly
/// the one before the write or the one after it (holders, tokens,
/// expiries, token counter), never as garbage, never as a free key when
/// it was held. Durable and not, through grants, renewals and releases of
/// a counting lease; in durable mode a release is not synced, so the
/// record last synced (holding the released slot still) may come back.
#[test]
fn a_write_torn_at_every_byte_reads_as_the_old_or_the_new_record() {
    for durable in [false, true] {
        let d = Dir::new("torn-bytes");
        let clock = ManualClock::new(1_000);
        let options = FileOptions {
            durable,
            ..opts(&clock, "b")
        };
        let store = FileStore::open_with(d.leases(), options).unwrap();
        let path = store.record_path("k");
        let (a, b) = (Holder::new(HolderId(1)), Holder::new(HolderId(2)));
        let seen = |s: &FileStore| {
            let info = s.txn(|tx| core::lease::inspect(tx, "k")).unwrap();
            format!("{} {:?}", info.last_token, info.holders)
        };
        let mut held = [0u64; 2];
        store
            .txn(|tx| core::lease::acquire(tx, "k", &a, 60_000, 2))
            .map(|g| held[0] = g.token)
            .unwrap();
        let mut synced = seen(&store);
        for step in [
            "acquire b",
            "renew a",
            "release a",
            "renew b",
            "acquire a",
            "release b",
        ] {
            let before = read_image(&path);
            let old = seen(&store);
            clock.advance(7);
            let (who, h) = if step.ends_with('a') {
                (0, &a)
            } else {
                (1, &b)
            };
            match &step[..step.len() - 2] {
                "acquire" => {
                    let g = store.txn(|tx| core::lease::acquire(tx, "k", h, 60_000, 2));
                    held[who] = g.unwrap().token;
                }
                "renew" => {
                    let t = held[who];
                    store
                        .txn(|tx| core::lease::renew(tx, "k", h.id, t, 60_000))
                        .unwrap();
                }
                _ => {
                    let t = held[who];
                    store
                        .txn(|tx| core::lease::release(tx, "k", h.id, t))
                        .unwrap();
                }
            }
            let after = read_image(&path);
            let new = seen(&store);
            assert_ne!(old, new, "{step} changed the record");
            let written: Vec<usize> = [0, 2]
                .into_iter()
                .filter(|&r| before[r] != after[r])
                .collect();
            assert_eq!(written.len(), 1, "{step}: one slot written");
            let r = written[0];
            let len = (0..after[r].len())
                .rev()
                .find(|&i| after[r][i] != before[r][i])
                .map_or(0, |i| i + 1);
            let mut images = Vec::new();
            for k in 0..=len {
                let mut slot = after[r][..k].to_vec();
                slot.extend_from_slice(&before[r][k..]);
                for watermark in [&before[1], &after[1]] {
                    let mut image = before.clone();
                    image[r] = slot.clone();
                    image[1] = watermark.clone();
                    images.push((format!("slot torn at byte {k}"), image));
                }
            }
            for k in 0..=16 {
                let mut image = after.clone();
                let mut w = after[1][..k].to_vec();
                w.extend_from_slice(&before[1][k..]);
                image[1] = w;
                images.push((format!("watermark torn at byte {k}"), image));
            }
            for (what, image) in images {
                let got = read_back(&d, &image, &clock);
                assert!(
                    got == old || got == new || (durable && got == synced),
                    "durable {durable}, {step}, {what}: read {got}, expected {old} or {new}"
                );
            }
            if !step.starts_with("release") {
                synced = new;
            }
        }
    }
}

/// What `image`, as the record file of "k" in a fresh directory, reads as
/// at `clock`'s time: the token counter and the live holders.
fn read_back(d: &Dir, image: &Image, clock: &ManualClock) -> String {
    use std::os::unix::fs::FileExt;
    let dir = d.0.join("read-back");
    let _ = std::fs::remove_dir_all(&dir);
    let reader = FileOptions {
        durable: false,
        ..opts(clock, "b")
    };
    let store = FileStore::open_with(&dir, reader).unwrap();
    let f = std::fs::File::create(store.record_path("k")).unwrap();
    for ((at, _), bytes) in REGIONS.iter().zip(image) {
        f.write_all_at(bytes, *at).unwrap();
    }
    drop(f);
    let info = store.txn(|tx| core::lease::inspect(tx, "k"));
    let info = info.unwrap_or_else(|e| panic!("read as an error: {e}"));
    format!("{} {:?}", info.last_token, info.holders)
}

/// A record file written before the header was checksummed (slot magic
/// `LHS1`: the checksum covers the payload only) still reads, and the next
/// write moves it to the current format.
#[test]
fn a_first_format_record_still_reads() {
    use std::os::unix::fs::FileExt;
    let d = Dir::new("v1-slot");
    let clock = ManualClock::new(1_000);
    let store = FileStore::open_with(d.leases(), opts(&clock, "b")).unwrap();
    let token = acquire(&store, "k", 1, 60_000).unwrap();
    let path = store.record_path("k");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut header = [0u8; 24];
    f.read_exact_at(&mut header, 0).unwrap();
    assert_eq!(&header[..4], b"LHS2", "the current format");
    let len = u32::from_le_bytes(header[12..16].try_into().unwrap()) as usize;
    let mut payload = vec![0u8; len];
    f.read_exact_at(&mut payload, 24).unwrap();
    let sum = payload.iter().fold(0xCBF2_9CE4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3)
    });
    f.write_all_at(b"LHS1", 0).unwrap();
    f.write_all_at(&sum.to_le_bytes(), 16).unwrap();
    drop(f);
    let info = store.txn(|tx| core::lease::inspect(tx, "k")).unwrap();
    assert_eq!((info.last_token, info.holders.len()), (token, 1));
    // The next write (the other slot) is in the current format.
    clock.advance(1);
    store
        .txn(|tx| core::lease::renew(tx, "k", HolderId(1), token, 60_000))
        .unwrap();
    let f = std::fs::File::open(&path).unwrap();
    let mut magic = [0u8; 4];
    f.read_exact_at(&mut magic, 16 << 20).unwrap();
    assert_eq!(&magic, b"LHS2", "written in the current format");
}
