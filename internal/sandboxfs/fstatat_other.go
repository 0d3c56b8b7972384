//go:build !amd64 && !arm64

package sandboxfs

import "syscall"

// Fstatat is lstat of name in dirfd, where syscall has no fstatat of its own, or one with
// another Stat_t (fstatat64).
func Fstatat(dirfd int, name string, st *syscall.Stat_t) error {
	fd, err := syscall.Openat(dirfd, name, OPath|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	return syscall.Fstat(fd, st)
}
