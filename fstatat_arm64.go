package minipy

import "syscall"

// fstatat is lstat of name in dirfd (see fstatat_amd64.go).
func fstatat(dirfd int, name string, st *syscall.Stat_t) error {
	return syscall.Fstatat(dirfd, name, st, _AT_SYMLINK_NOFOLLOW)
}
