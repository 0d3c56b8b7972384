package e2b

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
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
	filesystemconnect.UnimplementedFilesystemHandler      // (every call is served: watch.go has the watchers)
	rootUser                                         bool // the sandboxes have a root user (Config.RootUser)
}

func (s *Server) filesystemRoutes() {
	p, h := filesystemconnect.NewFilesystemHandler(filesystemService{rootUser: s.cfg.RootUser},
		connect.WithReadMaxBytes(maxEnvdMessage))
	s.envd.Handle(p, h)
}

// fsTarget is the sandbox's file methods as the request's user (its header h: envdUser)
// and the name there of an E2B path.
func fsTarget(ctx context.Context, rootUser bool, h http.Header, p string) (userFiles, string, error) {
	sb := ctx.Value(sandboxKey{}).(*sandbox)
	root, err := envdUser(rootUser, h, nil)
	if err != nil {
		return userFiles{}, "", connect.NewError(connect.CodeUnauthenticated, err)
	}
	f := userFiles{ns: sb.namespace(), root: root}
	if f.ns == nil {
		return f, "", connect.NewError(connect.CodeUnavailable, errors.New("the sandbox is not running"))
	}
	name, ok := workPath(p, f.home())
	if !ok {
		return f, "", connect.NewError(connect.CodeInvalidArgument, errors.New("path "+echo(p)+
			": a path of at most "+strconv.Itoa(maxPath)+" bytes"))
	}
	return f, name, nil
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

// entry is envd's EntryInfo of a file of f's sandbox, with its metadata.
func entry(f userFiles, fi minipy.FileInfo) *filesystem.EntryInfo {
	t := filesystem.FileType_FILE_TYPE_FILE
	switch {
	case fi.Mode&fs.ModeSymlink != 0:
		t = filesystem.FileType_FILE_TYPE_SYMLINK
	case fi.IsDir:
		t = filesystem.FileType_FILE_TYPE_DIRECTORY
	}
	p := sandboxPath(fi.Name)
	owner := "user"
	if fi.RootOwned {
		owner = "root"
	}
	e := &filesystem.EntryInfo{Name: path.Base(p), Type: t, Path: p, Size: fi.Size, Mode: uint32(fi.Mode.Perm()),
		Permissions: fi.Mode.String(), Owner: owner, Group: owner, ModifiedTime: timestamppb.New(fi.ModTime)}
	if t == filesystem.FileType_FILE_TYPE_SYMLINK {
		e.SymlinkTarget = proto.String(linkTarget(p, fi.Target))
	} else if md, err := f.ns.FileAttrs(fi.Name, metadataPrefix, f.opts()...); err == nil && len(md) > 0 {
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

func (fss filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	f, name, err := fsTarget(ctx, fss.rootUser, req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	fi, err := f.ns.Stat(name, f.opts()...)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: entry(f, fi)}), nil
}

// MakeDir makes a directory and its parents; one that is there already is AlreadyExists,
// which the SDK's makeDir reports as false.
func (fss filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	f, name, err := fsTarget(ctx, fss.rootUser, req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if _, err := f.ns.Stat(name, f.opts()...); err == nil {
		return nil, connect.NewError(connect.CodeAlreadyExists, errors.New(echo(req.Msg.GetPath())+" exists already"))
	}
	if err := f.ns.MakeDir(name, f.opts()...); err != nil {
		return nil, fsError(err)
	}
	fi, err := f.ns.Stat(name, f.opts()...)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: entry(f, fi)}), nil
}

func (fss filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	f, from, err := fsTarget(ctx, fss.rootUser, req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	_, to, err := fsTarget(ctx, fss.rootUser, req.Header(), req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	if err := f.ns.Rename(from, to, f.opts()...); err != nil {
		return nil, fsError(err)
	}
	fi, err := f.ns.Stat(to, f.opts()...)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: entry(f, fi)}), nil
}

func (fss filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	f, name, err := fsTarget(ctx, fss.rootUser, req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if err := f.ns.Remove(name, f.opts()...); err != nil && !errors.Is(err, fs.ErrNotExist) { // (E2B's remove of nothing succeeds)
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

// maxListed caps the entries of one ListDir.
const maxListed = 100_000

// ListDir lists a directory to depth levels (0 is 1), links not followed.
func (fss filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	f, name, err := fsTarget(ctx, fss.rootUser, req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := max(int(req.Msg.GetDepth()), 1)
	var entries []*filesystem.EntryInfo
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		files, err := f.ns.ListFiles(dir, f.opts()...)
		if err != nil {
			return err
		}
		for _, fi := range files {
			if len(entries) == maxListed {
				return connect.NewError(connect.CodeResourceExhausted, errors.New("more than 100000 entries: list less deep"))
			}
			entries = append(entries, entry(f, fi))
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
