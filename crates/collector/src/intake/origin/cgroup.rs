//! From a process or a cgroup to the container it runs in: the container id in a cgroup
//! path, a PID's cgroups, and a cgroup directory found by its inode (DogStatsD's
//! `|c:in-<inode>`).

use std::path::{Path, PathBuf};

/// Length of a container id: 64 hex digits (Docker, containerd, CRI-O, Podman).
const ID_LEN: usize = 64;

/// The container id in one cgroup path, as runtimes name their cgroups:
/// `/docker/<id>`, `/kubepods/burstable/pod<uid>/<id>`,
/// `/system.slice/docker-<id>.scope`, `…/cri-containerd-<id>.scope`, `…/crio-<id>.scope`,
/// `…/libpod-<id>.scope`. The last path segment that holds one wins (a container's
/// own cgroup is below its pod's).
pub fn container_id_in_path(path: &str) -> Option<&str> {
    path.rsplit('/').find_map(|segment| {
        let segment = segment.strip_suffix(".scope").unwrap_or(segment);
        let id = match segment.rfind('-') {
            Some(dash) if segment.len() - dash - 1 == ID_LEN => &segment[dash + 1..],
            _ => segment,
        };
        (id.len() == ID_LEN && id.bytes().all(|byte| byte.is_ascii_hexdigit())).then_some(id)
    })
}

/// The container id in the text of a `/proc/<pid>/cgroup` file (v1 `N:controllers:path`
/// lines, or v2's `0::path`).
pub fn container_id_in_proc_cgroup(text: &str) -> Option<&str> {
    text.lines().find_map(|line| line.splitn(3, ':').nth(2).and_then(container_id_in_path))
}

/// What a PID's cgroups say about its container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PidOrigin {
    /// It runs in this container.
    Container(String),
    /// It runs outside any container (a host process).
    NoContainer,
    /// Its `/proc` entry is gone: it exited before its datagram was read.
    Gone,
}

/// Reads `<proc_root>/<pid>/cgroup`.
pub fn pid_origin(proc_root: &Path, pid: u32) -> PidOrigin {
    match std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")) {
        Ok(text) => match container_id_in_proc_cgroup(&text) {
            Some(id) => PidOrigin::Container(id.to_owned()),
            None => PidOrigin::NoContainer,
        },
        Err(_) => PidOrigin::Gone,
    }
}

/// Directories walked at most to find one inode: a node's cgroup trees hold a few
/// thousand.
const MAX_WALK: usize = 200_000;

/// The container id of the cgroup directory with inode `inode` under `cgroup_root`
/// (every controller's tree on cgroup v1, the one tree on v2), found by walking the trees.
/// `None` when no directory has it, or its path names no container.
pub fn container_id_of_inode(cgroup_root: &Path, inode: u64) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let mut pending: Vec<PathBuf> = vec![cgroup_root.to_owned()];
    let mut walked = 0;
    while let Some(directory) = pending.pop() {
        walked += 1;
        if walked > MAX_WALK {
            return None;
        }
        let Ok(entries) = std::fs::read_dir(&directory) else { continue };
        for entry in entries.flatten() {
            // Cgroup files are not directories, and symlinks (v1's `cpu -> cpu,cpuacct`)
            // would walk a tree twice.
            let Ok(kind) = entry.file_type() else { continue };
            if !kind.is_dir() {
                continue;
            }
            let path = entry.path();
            if entry.metadata().is_ok_and(|metadata| metadata.ino() == inode) {
                return path.to_str().and_then(container_id_in_path).map(str::to_owned);
            }
            pending.push(path);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f4b1c0e8a9d2b7c6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d";

    #[test]
    fn every_runtime_naming_gives_the_id() {
        for path in [
            format!("/docker/{ID}"),
            format!("/kubepods/burstable/pod0f1e2d3c-aaaa-bbbb-cccc-0123456789ab/{ID}"),
            format!("/system.slice/docker-{ID}.scope"),
            format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f1e.slice/cri-containerd-{ID}.scope"
            ),
            format!("/machine.slice/libpod-{ID}.scope/container"),
            format!("/crio-{ID}.scope"),
        ] {
            assert_eq!(container_id_in_path(&path), Some(ID), "{path}");
        }
        for path in ["/", "/user.slice/user-0.slice/session-1.scope", "/docker", "/docker/abc", "/kubepods/pod1"] {
            assert_eq!(container_id_in_path(path), None, "{path}");
        }
    }

    #[test]
    fn a_proc_cgroup_file_gives_the_id_of_any_controller() {
        let v1 = format!("12:pids:/docker/{ID}\n11:memory:/docker/{ID}\n1:name=systemd:/docker/{ID}\n");
        assert_eq!(container_id_in_proc_cgroup(&v1), Some(ID));
        assert_eq!(container_id_in_proc_cgroup(&format!("0::/system.slice/docker-{ID}.scope\n")), Some(ID));
        assert_eq!(container_id_in_proc_cgroup("12:pids:/user.slice\n0::/init.scope\n"), None);
    }

    #[test]
    fn a_pid_is_read_from_its_proc_entry() {
        let proc_root = tempfile::tempdir().unwrap();
        std::fs::create_dir(proc_root.path().join("42")).unwrap();
        std::fs::write(proc_root.path().join("42/cgroup"), format!("3:cpu:/docker/{ID}\n")).unwrap();
        std::fs::create_dir(proc_root.path().join("7")).unwrap();
        std::fs::write(proc_root.path().join("7/cgroup"), "0::/init.scope\n").unwrap();
        assert_eq!(pid_origin(proc_root.path(), 42), PidOrigin::Container(ID.to_owned()));
        assert_eq!(pid_origin(proc_root.path(), 7), PidOrigin::NoContainer);
        assert_eq!(pid_origin(proc_root.path(), 9), PidOrigin::Gone);
    }

    #[test]
    fn an_inode_is_found_in_the_tree() {
        use std::os::unix::fs::MetadataExt;
        let root = tempfile::tempdir().unwrap();
        let container = root.path().join("memory/docker").join(ID);
        std::fs::create_dir_all(&container).unwrap();
        std::fs::create_dir_all(root.path().join("cpu/user.slice")).unwrap();
        let inode = std::fs::metadata(&container).unwrap().ino();
        assert_eq!(container_id_of_inode(root.path(), inode).as_deref(), Some(ID));
        let other = std::fs::metadata(root.path().join("cpu/user.slice")).unwrap().ino();
        assert_eq!(container_id_of_inode(root.path(), other), None, "a cgroup of no container");
        assert_eq!(container_id_of_inode(root.path(), u64::MAX), None);
    }
}
