"""The seccomp filter of a sandboxed call: a classic BPF program that bubblewrap installs before the call
starts.

It denies what a calculation never needs and an escape would: creating processes (fork, vfork, clone without
CLONE_THREAD: threads stay, bounded by the memory limit), namespaces, mounts, ptrace, kernel keys, BPF,
perf, module loading and io_uring. clone3 answers ENOSYS, so the C library falls back to clone, whose flags a
filter can read. A syscall of another ABI (32-bit on x86-64) kills the process: its numbers differ.
Programs exist for x86-64 and aarch64; elsewhere `program()` is None and the sandbox says so.
"""

from __future__ import annotations

import errno
import platform
import struct

# linux/filter.h, linux/seccomp.h, linux/audit.h
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JSET_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x45, 0x35, 0x06
SECCOMP_RET_ALLOW, SECCOMP_RET_KILL_PROCESS, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
CLONE_THREAD = 0x00010000
NR_OFFSET, ARCH_OFFSET, ARG0_OFFSET = 0, 4, 16  # struct seccomp_data (arg0's low 32 bits, little-endian)

DENIED = (
    "fork",
    "vfork",
    "ptrace",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "kexec_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "userfaultfd",
    "io_uring_setup",
    "process_vm_readv",
    "process_vm_writev",
    "open_by_handle_at",
    "personality",
    "acct",
    "quotactl",
)

# machine -> (AUDIT_ARCH, syscall numbers, the lowest number of another ABI sharing the arch value or None)
ARCHES = {
    "x86_64": (
        0xC000003E,
        {
            "fork": 57,
            "vfork": 58,
            "clone": 56,
            "clone3": 435,
            "ptrace": 101,
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "chroot": 161,
            "unshare": 272,
            "setns": 308,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "bpf": 321,
            "perf_event_open": 298,
            "kexec_load": 246,
            "init_module": 175,
            "finit_module": 313,
            "delete_module": 176,
            "reboot": 169,
            "swapon": 167,
            "swapoff": 168,
            "userfaultfd": 323,
            "io_uring_setup": 425,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "open_by_handle_at": 304,
            "personality": 135,
            "acct": 163,
            "quotactl": 179,
        },
        0x40000000,
    ),  # x32
    "aarch64": (
        0xC00000B7,
        {
            "clone": 220,
            "clone3": 435,
            "ptrace": 117,
            "mount": 40,
            "umount2": 39,
            "pivot_root": 41,
            "chroot": 51,
            "unshare": 97,
            "setns": 268,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "bpf": 280,
            "perf_event_open": 241,
            "kexec_load": 104,
            "init_module": 105,
            "finit_module": 273,
            "delete_module": 106,
            "reboot": 142,
            "swapon": 224,
            "swapoff": 225,
            "userfaultfd": 282,
            "io_uring_setup": 425,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "open_by_handle_at": 265,
            "personality": 92,
            "acct": 89,
            "quotactl": 60,
        },
        None,
    ),  # no fork/vfork on aarch64: clone covers them
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
    """The filter for `machine` (this one's by default) as bytes of `struct sock_filter`, or None where no
    program exists for it."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        return None
    arch, numbers, other_abi = ARCHES[machine]
    deny = sorted({numbers[name] for name in DENIED if name in numbers})
    eperm, enosys = SECCOMP_RET_ERRNO | errno.EPERM, SECCOMP_RET_ERRNO | errno.ENOSYS
    ops = [
        _op(BPF_LD_W_ABS, ARCH_OFFSET),
        _op(BPF_JEQ_K, arch, jt=1),
        _op(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
        _op(BPF_LD_W_ABS, NR_OFFSET),
    ]
    if other_abi is not None:
        ops += [_op(BPF_JGE_K, other_abi, jf=1), _op(BPF_RET_K, SECCOMP_RET_KILL_PROCESS)]
    for number in deny:  # each: equal -> the next op (EPERM), else skip it
        ops += [_op(BPF_JEQ_K, number, jf=1), _op(BPF_RET_K, eperm)]
    ops += [
        _op(BPF_JEQ_K, numbers["clone3"], jf=1),
        _op(BPF_RET_K, enosys),
        _op(BPF_JEQ_K, numbers["clone"], jf=4),  # not clone: allow (the last op)
        _op(BPF_LD_W_ABS, ARG0_OFFSET),
        _op(BPF_JSET_K, CLONE_THREAD, jt=0, jf=1),
        _op(BPF_RET_K, SECCOMP_RET_ALLOW),  # a thread
        _op(BPF_RET_K, eperm),  # a process
        _op(BPF_RET_K, SECCOMP_RET_ALLOW),
    ]
    return b"".join(ops)
