package e2b

import (
	"context"
	"errors"
	"io/fs"
	"path"
	"strconv"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/e2b/envd/proto/filesystem"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/e2b/envd/proto/filesystem/filesystemconnect"
)

// envd's filesystem service (E2B's filesystem.proto over connect-go): Stat, MakeDir, Move,
// ListDir and Remove where the sandbox writes (its working directory, /tmp, /dev/shm, its
// own root), through the namespace's file methods, which never leave those places. The SDK's
// files.list, makeDir, rename, remove, exists and getInfo call it.

type filesystemService struct {
	filesystemconnect.UnimplementedFilesystemHandler // (every call is served: watch.go has the watchers)
}

func (s *Server) filesystemRoutes() {
	p, h := filesystemconnect.NewFilesystemHandler(filesystemService{}, connect.WithReadMaxBytes(maxEnvdMessage))
	s.envd.Handle(p, h)
}

// fsTarget is the sandbox's namespace and the name in its working directory of an E2B path.
func fsTarget(ctx context.Context, p string) (*minipy.Namespace, string, error) {
	ns := ctx.Value(sandboxKey{}).(*sandbox).namespace()
	if ns == nil {
		return nil, "", connect.NewError(connect.CodeUnavailable, errors.New("the sandbox is not running"))
	}
	name, ok := workPath(p)
	if !ok {
		return nil, "", connect.NewError(connect.CodeInvalidArgument, errors.New("path "+echo(p)+
			": a path of at most "+strconv.Itoa(maxPath)+" bytes"))
	}
	return ns, name, nil
}

// fsError is a file method's error as a connect error of envd's code for it.
func fsError(err error) error {
	code := connect.CodeInternal
	switch {
	case errors.Is(err, fs.ErrNotExist):
		code = connect.CodeNotFound
	case errors.Is(err, fs.ErrExist):
		code = connect.CodeAlreadyExists
	case errors.Is(err, minipy.ErrBadPath), errors.Is(err, fs.ErrInvalid):
		code = connect.CodeInvalidArgument
	case errors.Is(err, minipy.ErrNamespaceClosed):
		code = connect.CodeUnavailable
	}
	return connect.NewError(code, err)
}

// entry is envd's EntryInfo of a file of ns's working directory, with its metadata.
func entry(ns *minipy.Namespace, fi minipy.FileInfo) *filesystem.EntryInfo {
	t := filesystem.FileType_FILE_TYPE_FILE
	switch {
	case fi.Mode&fs.ModeSymlink != 0:
		t = filesystem.FileType_FILE_TYPE_SYMLINK
	case fi.IsDir:
		t = filesystem.FileType_FILE_TYPE_DIRECTORY
	}
	p := sandboxPath(fi.Name)
	e := &filesystem.EntryInfo{Name: path.Base(p), Type: t, Path: p, Size: fi.Size, Mode: uint32(fi.Mode.Perm()),
		Permissions: fi.Mode.String(), Owner: "user", Group: "user", ModifiedTime: timestamppb.New(fi.ModTime)}
	if t == filesystem.FileType_FILE_TYPE_SYMLINK {
		e.SymlinkTarget = proto.String(linkTarget(p, fi.Target))
	} else if md, err := ns.FileAttrs(fi.Name, metadataPrefix); err == nil && len(md) > 0 {
		e.Metadata = md
	}
	return e
}

// linkTarget is the absolute path a symbolic link at p points to (envd's symlinkTarget),
// worked out from the target's text alone: nothing is followed.
func linkTarget(p, target string) string {
	if path.IsAbs(target) {
		return path.Clean(target)
	}
	return path.Join(path.Dir(p), target)
}

func (filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	ns, name, err := fsTarget(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	fi, err := ns.Stat(name)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: entry(ns, fi)}), nil
}

// MakeDir makes a directory and its parents; one that is there already is AlreadyExists,
// which the SDK's makeDir reports as false.
func (filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	ns, name, err := fsTarget(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if _, err := ns.Stat(name); err == nil {
		return nil, connect.NewError(connect.CodeAlreadyExists, errors.New(echo(req.Msg.GetPath())+" exists already"))
	}
	if err := ns.MakeDir(name); err != nil {
		return nil, fsError(err)
	}
	fi, err := ns.Stat(name)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: entry(ns, fi)}), nil
}

func (filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	ns, from, err := fsTarget(ctx, req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	_, to, err := fsTarget(ctx, req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	if err := ns.Rename(from, to); err != nil {
		return nil, fsError(err)
	}
	fi, err := ns.Stat(to)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: entry(ns, fi)}), nil
}

func (filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	ns, name, err := fsTarget(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if err := ns.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) { // (E2B's remove of nothing succeeds)
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

// maxListed caps the entries of one ListDir.
const maxListed = 100_000

// ListDir lists a directory to depth levels (0 is 1), links not followed.
func (filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	ns, name, err := fsTarget(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := max(int(req.Msg.GetDepth()), 1)
	var entries []*filesystem.EntryInfo
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		files, err := ns.ListFiles(dir)
		if err != nil {
			return err
		}
		for _, fi := range files {
			if len(entries) == maxListed {
				return connect.NewError(connect.CodeResourceExhausted, errors.New("more than 100000 entries: list less deep"))
			}
			entries = append(entries, entry(ns, fi))
			if fi.IsDir && level < depth {
				if err := walk(fi.Name, level+1); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(name, 1); err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return nil, err
		}
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystem.ListDirResponse{Entries: entries}), nil
}
