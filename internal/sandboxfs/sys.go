package sandboxfs

import (
	"fmt"
	"syscall"
	"unsafe"
)

// openat2 and its flags (linux/openat2.h), which the syscall package lacks (and the core
// module's go line keeps golang.org/x/sys, which has them, at a version too old to).
const (
	sysOpenat2          = 437 // the same on every architecture
	ResolveNoXdev       = 0x01
	ResolveNoMagiclinks = 0x02
	ResolveNoSymlinks   = 0x04
	ResolveBeneath      = 0x08
)

type openHow struct{ flags, mode, resolve uint64 }

// Openat2 is openat2(2) (O_CLOEXEC always), tried again on EINTR and on the EAGAIN of a
// rename that raced the walk.
func Openat2(dirfd int, name string, flags int, mode uint32, resolve uint64) (int, error) {
	p, err := syscall.BytePtrFromString(name)
	if err != nil {
		return -1, err
	}
	how := openHow{flags: uint64(flags | syscall.O_CLOEXEC), mode: uint64(mode), resolve: resolve}
	for tries := 0; ; tries++ {
		fd, _, errno := syscall.Syscall6(sysOpenat2, uintptr(dirfd), uintptr(unsafe.Pointer(p)),
			uintptr(unsafe.Pointer(&how)), unsafe.Sizeof(how), 0, 0)
		switch {
		case errno == 0:
			return int(fd), nil
		case errno == syscall.EINTR, errno == syscall.EAGAIN && tries < 100: // EAGAIN: a rename raced the walk
			continue
		case errno == syscall.ENOSYS:
			return -1, fmt.Errorf("the kernel has no openat2 (Linux 5.6 or later is needed): %w", errno)
		}
		return -1, errno
	}
}

// OPath is O_PATH, which syscall lacks: the same on every architecture Go runs Linux on
// (only alpha, parisc and sparc differ).
const OPath = 0x200000

// TmpfsMagic is a tmpfs's f_type (linux/magic.h).
const TmpfsMagic = 0x01021994

const (
	atSymlinkNofollow = 0x100
	atRemovedir       = 0x200
)

// Fchownat gives name in dirfd (not followed) to id, user and group.
func Fchownat(dirfd int, name string, id int) error {
	return syscall.Fchownat(dirfd, name, id, id, atSymlinkNofollow)
}

func unlinkat(dirfd int, name string) {
	syscall.Unlinkat(dirfd, name) //nolint:errcheck // best effort: a partial file
}

func unlinkatFlags(dirfd int, name string, flags int) error {
	p, err := syscall.BytePtrFromString(name)
	if err != nil {
		return err
	}
	_, _, errno := syscall.Syscall(syscall.SYS_UNLINKAT, uintptr(dirfd), uintptr(unsafe.Pointer(p)), uintptr(flags))
	if errno != 0 {
		return errno
	}
	return nil
}
