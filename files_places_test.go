package minipy_test

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// Absolute names reach where the sandbox writes, as its code sees it: the working
// directory at WorkDirPath, /tmp and /dev/shm; the host and the code see the same files.
func TestFilesAnywhere(t *testing.T) {
	for name, cfg := range map[string]minipy.IsolatedConfig{
		"template":    {WorkDirPath: "/home/user"},
		"no template": {NoTemplate: true},
	} {
		t.Run(name, func(t *testing.T) {
			e := newIsolated(t, cfg)
			home := cfg.WorkDirPath
			if home == "" {
				home = "/work"
			}
			ns := e.NewNamespace()
			defer ns.Close()
			require.NoError(t, ns.WriteFile("/tmp/repo/README.md", []byte("hello\n")))
			require.NoError(t, ns.WriteFile(home+"/in-home.txt", []byte("home")))
			assert.Equal(t, []any{"hello\n", "home"}, valueIn(t, e, ns,
				`(open("/tmp/repo/README.md").read(), open("in-home.txt").read())`))
			b, err := ns.ReadFile("in-home.txt")
			require.NoError(t, err)
			assert.Equal(t, "home", string(b), "the working directory by its absolute name is the same")

			valueIn(t, e, ns, `import os
os.makedirs("/tmp/repo/.git/objects", exist_ok=True)
open("/dev/shm/seg", "w").write("shared")
os.symlink("/etc/passwd", "/tmp/repo/out")
os.symlink("README.md", "/tmp/repo/in")`)
			b, err = ns.ReadFile("/dev/shm/seg")
			require.NoError(t, err)
			assert.Equal(t, "shared", string(b))
			b, err = ns.ReadFile("/tmp/repo/in")
			require.NoError(t, err)
			assert.Equal(t, "hello\n", string(b), "a link that stays in /tmp is followed")
			_, err = ns.ReadFile("/tmp/repo/out")
			assert.ErrorIs(t, err, minipy.ErrBadPath, "a link out of /tmp is not followed")

			list, err := ns.ListFiles("/tmp/repo")
			require.NoError(t, err)
			assert.Equal(t, []string{"/tmp/repo/.git", "/tmp/repo/README.md", "/tmp/repo/in", "/tmp/repo/out"}, fileNames(list))
			fi, err := ns.Stat("/tmp/repo/README.md")
			require.NoError(t, err)
			assert.Equal(t, "/tmp/repo/README.md", fi.Name)
			assert.Equal(t, int64(6), fi.Size)
			list, err = ns.ListFiles(home)
			require.NoError(t, err)
			assert.Contains(t, fileNames(list), home+"/in-home.txt")

			require.NoError(t, ns.MakeDir("/tmp/a/b"))
			require.NoError(t, ns.Rename("/tmp/repo/README.md", "/tmp/a/b/moved.md"))
			var le *os.LinkError
			err = ns.Rename("/tmp/a/b/moved.md", "/dev/shm/x")
			require.ErrorAs(t, err, &le, "no rename across file systems")
			assert.ErrorIs(t, err, syscall.EXDEV)
			require.NoError(t, ns.Remove("/tmp/repo"))
			assert.Equal(t, []any{false, true}, valueIn(t, e, ns,
				`import os; (os.path.exists("/tmp/repo"), os.path.exists("/tmp/a/b/moved.md"))`))
			if os.Geteuid() == 0 {
				assert.Equal(t, int64(1000), valueIn(t, e, ns, `import os; os.stat("/tmp/a/b").st_uid`),
					"what the host makes belongs to the code's user")
			}

			for _, bad := range []string{"/etc/passwd", "/usr/x", "/usr/lib/x", "/tmp/../etc/passwd", "/proc/self/environ",
				"/dev/null", "/namespaces/x"} {
				_, err := ns.ReadFile(bad)
				assert.ErrorIs(t, err, minipy.ErrBadPath, bad)
				assert.ErrorIs(t, ns.WriteFile(bad, []byte("x")), minipy.ErrBadPath, bad)
			}
			assert.ErrorIs(t, ns.Remove("/tmp"), fs.ErrInvalid, "the place itself")
			assert.ErrorIs(t, ns.Remove("/"), fs.ErrInvalid, "the root itself")
			assert.Error(t, ns.Remove("/usr"), "a mount of the image's")
			assert.Equal(t, true, valueIn(t, e, ns, `import os; os.path.isdir("/usr/lib")`))

			// Its root is its own to write: the host's and the code's files anywhere else.
			require.NoError(t, ns.WriteFile("/0/multi_test_file0.txt", []byte("zero")))
			require.NoError(t, ns.WriteFile("/tmpx", []byte("beside /tmp")))
			assert.Equal(t, []any{"zero", "beside /tmp"}, valueIn(t, e, ns, `import os
os.makedirs("/app/src"); open("/app/src/main.py", "w").write("print(1)")
(open("/0/multi_test_file0.txt").read(), open("/tmpx").read())`))
			b, err = ns.ReadFile("/app/src/main.py")
			require.NoError(t, err)
			assert.Equal(t, "print(1)", string(b))
			list, err = ns.ListFiles("/")
			require.NoError(t, err)
			assert.Subset(t, fileNames(list), []string{"/0", "/app", "/tmp", "/tmpx", "/usr"})

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			events, err := ns.WatchDir(ctx, "/tmp/a", true)
			require.NoError(t, err)
			valueIn(t, e, ns, `open("/tmp/a/b/new.txt", "w").write("n")`)
			select {
			case ev := <-events:
				assert.Equal(t, "b/new.txt", ev.Name)
			case <-time.After(30 * time.Second):
				t.Fatal("no event from the sandbox's /tmp")
			}
		})
	}
}

// The host does not cross into a mount under /tmp (a Mounts bind of the host's) nor follow
// the code's links out, and reaches nothing of another sandbox or of the host's own /tmp.
func TestFilesAnywhereStaysInTheSandbox(t *testing.T) {
	shared := t.TempDir()
	require.NoError(t, os.WriteFile(shared+"/host.txt", []byte("the host's"), 0o644))
	e := newIsolated(t, minipy.IsolatedConfig{Mounts: []minipy.Mount{{Source: shared, Target: "/tmp/shared"}}})
	a, b := e.NewNamespace(), e.NewNamespace()
	defer a.Close()
	defer b.Close()
	require.NoError(t, a.WriteFile("/tmp/mine.txt", []byte("a's")))
	_, err := b.ReadFile("/tmp/mine.txt")
	assert.ErrorIs(t, err, fs.ErrNotExist, "another sandbox's /tmp is its own")
	_, err = os.Stat("/tmp/mine.txt")
	assert.ErrorIs(t, err, fs.ErrNotExist, "the host's /tmp holds nothing of it")

	assert.Equal(t, "the host's", valueIn(t, e, a, `open("/tmp/shared/host.txt").read()`), "the code sees the mount")
	_, err = a.ReadFile("/tmp/shared/host.txt")
	assert.ErrorIs(t, err, minipy.ErrBadPath, "the host does not enter it")
	assert.Error(t, a.Remove("/tmp/shared"))
	_, err = os.Stat(shared + "/host.txt")
	assert.NoError(t, err, "nothing of the mount's was removed")

	// The code's links, to its /proc and out of /tmp, lead the host nowhere.
	valueIn(t, e, a, `import os
os.symlink("/proc/self/root/etc/hostname", "/tmp/proc-link")
os.symlink("../../etc", "/tmp/up")`)
	for _, p := range []string{"/tmp/proc-link", "/tmp/up/hostname"} {
		_, err := a.ReadFile(p)
		assert.ErrorIs(t, err, minipy.ErrBadPath, p)
		assert.ErrorIs(t, a.WriteFile(p, []byte("x")), minipy.ErrBadPath, p)
	}
}

// Save and Restore cover the whole of what the sandbox writes: its /tmp, /dev/shm and root
// besides the working directory, never what is mounted there (the image's, a Mounts bind of
// the host's), and a restore writes nowhere else, whatever links the target's code made.
func TestSaveRestoreSandboxFiles(t *testing.T) {
	shared := t.TempDir()
	require.NoError(t, os.WriteFile(shared+"/host.txt", []byte("the host's"), 0o644))
	for name, cfg := range map[string]minipy.IsolatedConfig{
		"template":    {WorkDirPath: "/home/user", Mounts: []minipy.Mount{{Source: shared, Target: "/tmp/shared", Writable: true}}},
		"no template": {NoTemplate: true},
	} {
		t.Run(name, func(t *testing.T) {
			e := newIsolated(t, cfg)
			ns := e.NewNamespace()
			defer ns.Close()
			valueIn(t, e, ns, `import os
os.makedirs("/tmp/repo/.git"); open("/tmp/repo/.git/HEAD", "w").write("ref: main\n")
os.symlink(".git/HEAD", "/tmp/repo/head"); os.chmod("/tmp/repo/.git/HEAD", 0o600)
open("/dev/shm/seg", "w").write("shared")
os.makedirs("/app/empty"); open("/app/main.py", "w").write("print(1)")
open("here.txt", "w").write("home")
x = 42`)
			var saved bytes.Buffer
			info, err := ns.Save(&saved)
			require.NoError(t, err)
			assert.Equal(t, 1, info.Files, "here.txt")
			assert.Equal(t, 8, info.SandboxFiles, "tmp/repo, .git, HEAD, head, dev/shm/seg, app, app/empty, app/main.py: "+
				"not the image's /bin or /home, nor the mount at /tmp/shared")
			assert.NotContains(t, saved.String(), "the host's")

			target := e.NewNamespace()
			defer target.Close()
			require.NoError(t, target.WriteFile("/tmp/repo/.git/HEAD", []byte("to be replaced")))
			require.NoError(t, target.WriteFile("/tmp/mine.txt", []byte("stays")))
			require.NoError(t, target.Restore(bytes.NewReader(saved.Bytes())))
			assert.Equal(t, []any{"ref: main\n", ".git/HEAD", "0o600", "shared", "print(1)", true, "home", "stays", int64(42),
				"usr/bin"}, valueIn(t, e, target, `import os
(open("/tmp/repo/head").read(), os.readlink("/tmp/repo/head"), oct(os.stat("/tmp/repo/.git/HEAD").st_mode & 0o777),
 open("/dev/shm/seg").read(), open("/app/main.py").read(), os.path.isdir("/app/empty"), open("here.txt").read(),
 open("/tmp/mine.txt").read(), x, os.readlink("/bin"))`))

			// The target's code links /tmp/repo out of /tmp before the restore: nothing is
			// written through it.
			other := e.NewNamespace()
			defer other.Close()
			valueIn(t, e, other, `import os; os.makedirs("/app/empty"); os.symlink("/tmp/shared", "/tmp/repo")`)
			err = other.Restore(bytes.NewReader(saved.Bytes()))
			assert.ErrorIs(t, err, minipy.ErrBadPath, "the link is not followed out of /tmp")
			entries, err := os.ReadDir(shared)
			require.NoError(t, err)
			assert.Len(t, entries, 1, "nothing written into the host's directory")
		})
	}
}
