//! NUMA placement of the host side of an upload: the node a GPU hangs off, found from its PCI
//! address (`/sys/bus/pci/devices/<domain:bus:device.0>/numa_node`), with that node's CPUs
//! (`/sys/devices/system/node/node<N>/cpulist`). Reader threads run on those CPUs and pinned
//! staging is allocated from that node's memory, so the host-to-device copies do not cross the
//! socket interconnect (about 30-40 % of the link on dual-socket hosts).
//!
//! Best effort, never an error: a machine with one node, a GPU whose node the kernel does not
//! know (`-1`, virtual machines), a cgroup that allows none of the node's CPUs, or a kernel that
//! refuses the memory policy leaves everything where it was. No libnuma: two system calls
//! (`sched_setaffinity`, `set_mempolicy`). `SAFETENSORS_NUMA=0` (or `off`) turns it off for the
//! process, read once.

use std::path::Path;
use std::sync::{Mutex, OnceLock};

/// A NUMA node and the CPUs of it this process may run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub id: usize,
    pub cpus: Vec<usize>,
}

/// The most node numbers a memory-policy mask covers here (Linux's default `MAX_NUMNODES` is
/// 1024 at most).
const MAX_NODES: usize = 1024;

/// Parses a kernel CPU list ("0-3,8,10-11") into its CPUs, or `None` when malformed.
pub(crate) fn parse_cpulist(s: &str) -> Option<Vec<usize>> {
    let s = s.trim();
    let mut cpus = Vec::new();
    if s.is_empty() {
        return Some(cpus);
    }
    for part in s.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    Some(cpus)
}

/// The PCI address sysfs names a device by, from the driver's domain, bus and device numbers.
pub(crate) fn pci_address(domain: i32, bus: i32, device: i32) -> String {
    format!("{domain:04x}:{bus:02x}:{device:02x}.0")
}

/// The node of the PCI device `address` under the sysfs tree `root` ("/sys" on a real machine),
/// with all its CPUs; `None` where there is nothing to gain or to go by: fewer than two nodes,
/// an unknown node (`-1`), unreadable files.
pub(crate) fn node_of(root: &Path, address: &str) -> Option<Node> {
    let nodes = std::fs::read_to_string(root.join("devices/system/node/online")).ok()?;
    if parse_cpulist(&nodes)?.len() < 2 {
        return None;
    }
    let raw = std::fs::read_to_string(root.join("bus/pci/devices").join(address).join("numa_node"))
        .ok()?;
    let id: i64 = raw.trim().parse().ok()?;
    if id < 0 || id as usize >= MAX_NODES {
        return None;
    }
    let id = id as usize;
    let list =
        std::fs::read_to_string(root.join(format!("devices/system/node/node{id}/cpulist"))).ok()?;
    Some(Node {
        id,
        cpus: parse_cpulist(&list)?,
    })
}

/// Where a reader thread that may run on `inherited` (the mask it got from whoever started the
/// upload) should run for a GPU on `node`: the node's CPUs among those, when they are enough to
/// be worth it (at least half of what it had, or 8, the most readers a default ring starts);
/// `None` leaves it where it is (a caller confined mostly elsewhere keeps its readers spread).
pub(crate) fn reader_cpus(node: &Node, inherited: &[usize]) -> Option<Vec<usize>> {
    let cpus: Vec<usize> = node
        .cpus
        .iter()
        .copied()
        .filter(|c| inherited.contains(c))
        .collect();
    let enough = !cpus.is_empty() && (cpus.len() * 2 >= inherited.len() || cpus.len() >= 8);
    (enough && cpus.len() < inherited.len()).then_some(cpus)
}

/// Whether placement is on (`SAFETENSORS_NUMA` unset, or anything but 0, off, false or no in
/// any case).
fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let v = std::env::var("SAFETENSORS_NUMA").unwrap_or_default();
        !matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "off" | "false" | "no"
        )
    })
}

/// The CPUs the calling thread may run on (its affinity mask), or empty when unknown.
fn thread_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the call fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// The node of device `ordinal` (whose PCI domain, bus and device numbers `pci` gives), looked
/// up once per device for the process (a failed driver query is asked again next time); `None`
/// when placement is off or there is nothing to place.
pub(crate) fn gpu_node(
    ordinal: usize,
    pci: impl FnOnce() -> Option<(i32, i32, i32)>,
) -> Option<Node> {
    static NODES: Mutex<Vec<(usize, Option<Node>)>> = Mutex::new(Vec::new());
    if !enabled() {
        return None;
    }
    let known = |nodes: &Vec<(usize, Option<Node>)>| {
        nodes
            .iter()
            .find(|(o, _)| *o == ordinal)
            .map(|(_, n)| n.clone())
    };
    if let Some(node) = known(&NODES.lock().unwrap_or_else(|e| e.into_inner())) {
        return node;
    }
    // Asked without the lock: the driver and sysfs are not waited for by other devices' calls.
    let (domain, bus, device) = pci()?;
    let node = node_of(Path::new("/sys"), &pci_address(domain, bus, device));
    let mut nodes = NODES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(first) = known(&nodes) {
        return first;
    }
    nodes.push((ordinal, node.clone()));
    node
}

/// Runs the calling reader thread (which ends with its run) on `node`'s CPUs among those it
/// may use, where [`reader_cpus`] says so. Best effort: a refusal leaves it where it was.
pub(crate) fn run_on(node: &Node) {
    let Some(cpus) = reader_cpus(node, &thread_cpus()) else {
        return;
    };
    // SAFETY: builds a CPU set in a zeroed cpu_set_t and applies it to this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(c, &mut set);
        }
        let _ = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

const MPOL_PREFERRED: libc::c_long = 1;
const MASK_WORDS: usize = MAX_NODES / 64;
/// `maxnode` as the kernel counts it: one more than the bits it reads (libnuma passes the same).
const MAXNODE: libc::c_ulong = MAX_NODES as libc::c_ulong + 1;

/// For its life, the calling thread's memory comes from `node` where it can (the kernel's
/// "preferred" policy: other nodes when that one is full); the thread's own policy comes back
/// on drop. Pinned memory allocated meanwhile is placed there.
pub(crate) struct PreferNode {
    saved: Option<(libc::c_int, [libc::c_ulong; MASK_WORDS])>,
}

/// The calling thread's memory policy (mode and node mask), or `None` where the kernel refuses
/// to say.
fn thread_policy() -> Option<(libc::c_int, [libc::c_ulong; MASK_WORDS])> {
    let mut mode: libc::c_int = 0;
    let mut mask = [0 as libc::c_ulong; MASK_WORDS];
    // SAFETY: get_mempolicy writes the mode and a mask of MAX_NODES bits into our buffers.
    let got = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut libc::c_int,
            mask.as_mut_ptr(),
            MAXNODE,
            std::ptr::null_mut::<libc::c_void>(),
            0 as libc::c_ulong,
        )
    };
    (got == 0).then_some((mode, mask))
}

impl PreferNode {
    pub(crate) fn new(node: Option<&Node>) -> PreferNode {
        let Some(node) = node else {
            return PreferNode { saved: None };
        };
        let Some((mode, old)) = thread_policy() else {
            return PreferNode { saved: None };
        };
        let mut mask = [0 as libc::c_ulong; MASK_WORDS];
        mask[node.id / 64] |= 1 << (node.id % 64);
        // SAFETY: a mask of MAX_NODES bits with the one node set.
        let set = unsafe {
            libc::syscall(
                libc::SYS_set_mempolicy,
                MPOL_PREFERRED,
                mask.as_ptr(),
                MAXNODE,
            )
        };
        PreferNode {
            saved: (set == 0).then_some((mode, old)),
        }
    }
}

impl Drop for PreferNode {
    fn drop(&mut self) {
        if let Some((mode, mask)) = &self.saved {
            // SAFETY: restores the policy read in `new` (mode and mask as the kernel gave them).
            unsafe {
                libc::syscall(
                    libc::SYS_set_mempolicy,
                    *mode as libc::c_long,
                    mask.as_ptr(),
                    MAXNODE,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_the_kernel_writes_them() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpulist(""), Some(vec![]));
        assert_eq!(parse_cpulist("5"), Some(vec![5]));
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("a-b"), None);
        assert_eq!(parse_cpulist("0-99999999"), None);
    }

    #[test]
    fn pci_addresses_are_sysfs_names() {
        assert_eq!(pci_address(0, 0x3b, 0), "0000:3b:00.0");
        assert_eq!(pci_address(1, 0xc1, 0x1f), "0001:c1:1f.0");
    }

    /// A sysfs tree with `nodes` online and the GPU at 0000:3b:00.0 on node `gpu`.
    fn tree(nodes: &str, gpu: &str, cpulists: &[(usize, &str)]) -> std::path::PathBuf {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "st-numa-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let dev = root.join("bus/pci/devices/0000:3b:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("numa_node"), format!("{gpu}\n")).unwrap();
        std::fs::create_dir_all(root.join("devices/system/node")).unwrap();
        std::fs::write(root.join("devices/system/node/online"), nodes).unwrap();
        for (id, list) in cpulists {
            let n = root.join(format!("devices/system/node/node{id}"));
            std::fs::create_dir_all(&n).unwrap();
            std::fs::write(n.join("cpulist"), list).unwrap();
        }
        root
    }

    #[test]
    fn the_gpus_node_and_its_cpus() {
        let two = tree("0-1\n", "1", &[(0, "0-15,32-47\n"), (1, "16-31,48-63\n")]);
        let node = node_of(&two, "0000:3b:00.0").unwrap();
        assert_eq!(node.id, 1);
        assert_eq!(node.cpus, (16..32).chain(48..64).collect::<Vec<_>>());
        // Another device: nothing known.
        assert_eq!(node_of(&two, "0000:3c:00.0"), None);
        let _ = std::fs::remove_dir_all(two);
    }

    #[test]
    fn readers_move_only_where_enough_of_the_node_is_theirs() {
        let node = Node {
            id: 1,
            cpus: (16..32).chain(48..64).collect(),
        };
        // The whole machine: the node's 32 CPUs.
        let all: Vec<usize> = (0..64).collect();
        assert_eq!(reader_cpus(&node, &all), Some(node.cpus.clone()));
        // A cgroup of 8 CPUs, 4 on the GPU's node: half, so those 4.
        let half = [0, 1, 2, 3, 16, 17, 18, 19];
        assert_eq!(reader_cpus(&node, &half), Some(vec![16, 17, 18, 19]));
        // 7 CPUs elsewhere and 1 there: the readers stay spread.
        let mostly_elsewhere = [0, 1, 2, 3, 4, 5, 6, 16];
        assert_eq!(reader_cpus(&node, &mostly_elsewhere), None);
        // None there, or already only there: nothing to change.
        assert_eq!(reader_cpus(&node, &[0, 1]), None);
        assert_eq!(reader_cpus(&node, &[16, 17]), None);
        // Many CPUs there even if fewer than half: 8 is enough for a default ring.
        let wide: Vec<usize> = (0..16).chain(16..24).chain(64..100).collect();
        assert_eq!(reader_cpus(&node, &wide), Some((16..24).collect()));
    }

    #[test]
    fn one_node_or_an_unknown_node_places_nothing() {
        let one = tree("0\n", "0", &[(0, "0-7")]);
        assert_eq!(node_of(&one, "0000:3b:00.0"), None);
        let unknown = tree("0-1\n", "-1", &[(0, "0-3"), (1, "4-7")]);
        assert_eq!(node_of(&unknown, "0000:3b:00.0"), None);
        let garbage = tree("0-1\n", "x", &[(0, "0-3"), (1, "4-7")]);
        assert_eq!(node_of(&garbage, "0000:3b:00.0"), None);
        for t in [one, unknown, garbage] {
            let _ = std::fs::remove_dir_all(t);
        }
    }

    #[test]
    fn a_preferred_node_is_set_and_the_threads_own_policy_restored() {
        // Node 0 exists on every Linux machine; the policy must be back to the default after.
        let read = || thread_policy().map(|(mode, mask)| (mode, mask[0]));
        let before = read();
        {
            let p = PreferNode::new(Some(&Node {
                id: 0,
                cpus: vec![0],
            }));
            // Where the kernel (or a seccomp profile) refuses memory policies, nothing is set
            // and nothing needs restoring.
            let during = read();
            if p.saved.is_some() {
                let (mode, mask) = during.expect("the policy was read before being set");
                assert_eq!((mode, mask & 1), (MPOL_PREFERRED as libc::c_int, 1));
            } else {
                assert_eq!(during, before);
            }
        }
        assert_eq!(read(), before);
        // No node: nothing changes.
        {
            let _p = PreferNode::new(None);
            assert_eq!(read(), before);
        }
    }
}
