package minipy_test

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/internal/worker"
)

// runAs runs the shell script in the namespace's sandbox as user ("" or "root") and
// returns its stdout and stderr, failing the test unless it exits 0.
func runAs(t *testing.T, ns *minipy.Namespace, user, script string) (string, string) {
	t.Helper()
	p, err := ns.Start(minipy.Command{Args: []string{"/bin/sh", "-c", script}, User: user})
	require.NoError(t, err)
	require.NoError(t, p.Stdin.Close())
	stdout, stderr, st := output(t, p)
	require.Equal(t, 0, st.ExitStatus(), "%s\nstdout: %s\nstderr: %s", script, stdout, stderr)
	return stdout, stderr
}

// newRootUserEngine is an engine whose sandboxes have a root user, set up in the host's
// fork code or, with osFork, in Python.
func newRootUserEngine(t *testing.T, osFork bool) *minipy.Isolated {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a root user needs a root host (ErrNoRootUser: TestRootUserRefused)")
	}
	return newIsolatedForking(t, minipy.IsolatedConfig{RootUser: true}, osFork)
}

// A sandbox with a root user: commands as root, sudo, root's home, and the file methods as
// root; the set-up in C and in Python alike.
func TestRootUser(t *testing.T) {
	for _, osFork := range []bool{false, true} {
		t.Run(map[bool]string{false: "fork code", true: "python"}[osFork], func(t *testing.T) {
			e := newRootUserEngine(t, osFork)
			ns := e.NewNamespace()
			defer ns.Close()

			out, _ := runAs(t, ns, "root", `id -u; id -g; id -G; echo "$HOME $USER"; stat -c '%u %a' /root; pwd`)
			assert.Equal(t, "0\n0\n0\n/root root\n0 700\n/work\n", out, "a command as root")
			out, _ = runAs(t, ns, "", `id -u; command -v sudo; sudo id -u; sudo -u user id -u; sudo -i pwd; `+
				`X=1 sudo sh -c 'echo "[$X] $HOME $USER $SUDO_USER"'; X=1 sudo -E sh -c 'echo "[$X]"'`)
			assert.Equal(t, "1000\n"+worker.SudoDir+"/sudo\n0\n1000\n/root\n[] /root root user\n[1]\n", out,
				"sudo: -u, -i, the environment reset (but with -E)")
			_, errs := runAs(t, ns, "", `! sudo -u nobody2 true; ! sudo -Z true; ! sudo`)
			assert.Contains(t, errs, "unknown user nobody2")
			assert.Contains(t, errs, "-Z: not an option")

			// What root makes is root's: inside, and on the host (a host user of its own).
			runAs(t, ns, "", `sudo sh -c 'echo secret > /root/key; chmod 600 /root/key; echo r > mine-root; `+
				`echo t > /tmp/t; mkdir -p /srv/app; echo a > /srv/app/a'; echo u > mine`)
			var st syscall.Stat_t
			require.NoError(t, syscall.Lstat(filepath.Join(ns.WorkDir(), "mine-root"), &st))
			assert.Equal(t, uint32(worker.RootUID()), st.Uid, "root's file in the working directory, on the host")
			assert.Equal(t, uint32(65533), st.Uid, "the host user of the sandboxes' root (docs)")
			require.NoError(t, syscall.Lstat(filepath.Join(ns.WorkDir(), "mine"), &st))
			assert.Equal(t, uint32(worker.UID()), st.Uid)

			// The file methods act as the user (the code's reach) unless AsRoot.
			_, err := ns.ReadFile("/root/key")
			assert.ErrorIs(t, err, fs.ErrPermission, "root's home is not the user's to read")
			b, err := ns.ReadFile("/root/key", minipy.AsRoot())
			require.NoError(t, err)
			assert.Equal(t, "secret\n", string(b))
			require.NoError(t, ns.WriteFile("/root/hello.txt", []byte("hello"), minipy.AsRoot()))
			require.NoError(t, ns.WriteFile("from-host-as-root", []byte("x"), minipy.AsRoot()))
			require.NoError(t, ns.MakeDir("/etc2/conf", minipy.AsRoot()))
			infos, err := ns.ListFiles("/root", minipy.AsRoot())
			require.NoError(t, err)
			owned := map[string]bool{}
			for _, fi := range infos {
				owned[fi.Name] = fi.RootOwned
			}
			assert.Equal(t, map[string]bool{"/root/hello.txt": true, "/root/key": true}, owned)
			fi, err := ns.Stat("mine")
			require.NoError(t, err)
			assert.False(t, fi.RootOwned)
			out, _ = runAs(t, ns, "", `stat -c '%u %n' /root/hello.txt from-host-as-root /etc2/conf mine`)
			assert.Equal(t, "0 /root/hello.txt\n0 from-host-as-root\n0 /etc2/conf\n1000 mine\n", out)

			// Save and Restore keep whose each file is.
			var saved bytes.Buffer
			_, err = ns.Save(&saved)
			require.NoError(t, err)
			ns2 := e.NewNamespace()
			defer ns2.Close()
			require.NoError(t, ns2.Restore(&saved))
			out, _ = runAs(t, ns2, "root", `stat -c '%u %a %n' /root /root/key /root/hello.txt mine-root mine /tmp/t `+
				`/srv/app /srv/app/a; cat /root/key`)
			assert.Equal(t, "0 700 /root\n0 600 /root/key\n0 644 /root/hello.txt\n0 644 mine-root\n1000 644 mine\n"+
				"0 644 /tmp/t\n0 755 /srv/app\n0 644 /srv/app/a\nsecret\n", out)
		})
	}
}

// Root is root over the sandbox alone: each probe is what a hostile model's code would try
// as root, and each fails as it does for the user; the sandbox is still whole afterwards.
func TestRootUserHostile(t *testing.T) {
	e := newRootUserEngine(t, false)
	ns := e.NewNamespace()
	defer ns.Close()
	probes := map[string]string{
		"write the image":          `touch /usr/bin/x`,
		"write /etc":               `echo x >> /etc/passwd`,
		"mount":                    `mkdir -p /tmp/m && mount -t tmpfs none /tmp/m`,
		"a new user namespace":     `unshare -U true`,
		"another uid":              `setpriv --reuid=12345 true`,
		"the host's root":          `python3 -c 'import os; os.setresuid(65534, 65534, 65534)'`,
		"a raw socket":             `python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)'`,
		"its network's sysctls":    `echo 0 > /proc/sys/net/ipv4/ip_unprivileged_port_start`,
		"the kernel's sysctls":     `echo 3 > /proc/sys/vm/drop_caches`,
		"the guardian's memory":    `cat /proc/1/environ`,
		"a device":                 `mknod /tmp/mem c 1 1 && head -c1 /tmp/mem`,
		"raise a hard limit":       `prlimit --pid $$ --nofile=1048576:1048576`,
		"chroot":                   `python3 -c 'import os; os.chroot("/tmp")'`,
		"the kernel's log":         `dmesg`,
		"an unmapped owner":        `touch /tmp/x && chown 12345 /tmp/x`,
		"the host's name":          `hostname evil`,
		"another process's ns":     `nsenter -t 1 -m true`,
		"the sandbox's seccomp":    `python3 -c 'import ctypes; assert ctypes.CDLL(None).syscall(321, 0, 0, 0) == 0'`,
		"the loopback's addresses": `ip addr add 10.9.9.9/32 dev lo`,
	}
	for what, script := range probes {
		p, err := ns.Start(minipy.Command{Args: []string{"/bin/sh", "-c", script}, User: "root"})
		require.NoError(t, err)
		require.NoError(t, p.Stdin.Close())
		stdout, stderr, st := output(t, p)
		assert.NotEqual(t, 0, st.ExitStatus(), "%s as root: %s got through\nstdout: %s\nstderr: %s", what, script,
			stdout, stderr)
	}
	// The guardian, pid 1, ignores what root sends it; the sandbox still answers.
	runAs(t, ns, "root", `kill -9 1; kill -TERM 1; kill -STOP 1; true`)
	assert.Equal(t, int64(2), valueIn(t, e, ns, "1 + 1"))
	// No descriptor of the template's (its user namespace) reached the sandbox.
	out, _ := runAs(t, ns, "root", `ls -l /proc/self/fd | grep -c ' -> user:' || true`)
	assert.Equal(t, "0\n", out)
}

// A root user needs a root host and the template; a command as root or AsRoot needs a
// sandbox with one.
func TestRootUserRefused(t *testing.T) {
	if os.Geteuid() == 0 {
		_, err := minipy.NewIsolated(minipy.IsolatedConfig{RootUser: true, NoTemplate: true})
		assert.ErrorIs(t, err, minipy.ErrNoRootUser)
	}
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	_, err := ns.Start(minipy.Command{Args: []string{"true"}, User: "root"})
	assert.ErrorIs(t, err, minipy.ErrNoRootUser)
	_, err = ns.Start(minipy.Command{Args: []string{"true"}, User: "admin"})
	assert.Error(t, err)
	assert.ErrorIs(t, ns.WriteFile("x", []byte("x"), minipy.AsRoot()), minipy.ErrNoRootUser)
	_, err = ns.ReadFile("/root/x", minipy.AsRoot())
	assert.ErrorIs(t, err, minipy.ErrNoRootUser)
	_, err = minipy.NewNamespace().ReadFile("x", minipy.AsRoot())
	assert.Error(t, err)
	out, _ := runAs(t, ns, "", `id -u; command -v sudo || echo none; test -e /root && echo home || echo no home`)
	assert.Equal(t, "1000\nnone\nno home\n", out, "no sudo and no /root without a root user")
}
