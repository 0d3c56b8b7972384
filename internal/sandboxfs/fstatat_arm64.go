package sandboxfs

import "syscall"

// Fstatat is lstat of name in dirfd (see fstatat_amd64.go).
func Fstatat(dirfd int, name string, st *syscall.Stat_t) error {
	return syscall.Fstatat(dirfd, name, st, atSymlinkNofollow)
}
