package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/e2b/envd/proto/filesystem"
)

// envd's watchers (files.watchDir): WatchDir streams a directory's changes (Namespace.
// WatchDir) until its client goes; CreateWatcher, GetWatcherEvents and RemoveWatcher are
// the same kept by the server, whose events the client takes in turns: at most
// maxPolled waiting (then the oldest go). A sandbox has at most maxSandboxWatch of both
// kinds at once (each an inotify instance of the server's user: the engine has 32 for all
// its sandboxes). They end with the watched directory, and the polled ones with the
// sandbox.

const (
	maxPolled       = 1000
	maxSandboxWatch = 8
)

var watchTypes = map[minipy.FileEventOp]filesystem.EventType{
	minipy.FileCreated: filesystem.EventType_EVENT_TYPE_CREATE, minipy.FileWritten: filesystem.EventType_EVENT_TYPE_WRITE,
	minipy.FileRemoved: filesystem.EventType_EVENT_TYPE_REMOVE, minipy.FileRenamed: filesystem.EventType_EVENT_TYPE_RENAME,
	minipy.FileChmod: filesystem.EventType_EVENT_TYPE_CHMOD,
}

// watchOf starts a watch of the directory p of ctx's sandbox, as the request's user (its
// header h; rootUser: Config.RootUser), until watchCtx ends; it holds one of the sandbox's
// watches until the events' channel closes.
func watchOf(ctx, watchCtx context.Context, rootUser bool, h http.Header, p string, recursive bool) (userFiles, string,
	<-chan minipy.FileEvent, error) {
	f, name, err := fsTarget(ctx, rootUser, h, p)
	if err != nil {
		return f, "", nil, err
	}
	sb := sandboxFrom(ctx)
	sb.mu.Lock()
	full := sb.watching >= maxSandboxWatch
	if !full {
		sb.watching++
	}
	sb.mu.Unlock()
	if full {
		return f, "", nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("the sandbox watches %d "+
			"directories, its most: stop a watch first", maxSandboxWatch))
	}
	events, err := f.ns.WatchDir(watchCtx, name, recursive, f.opts()...)
	if err != nil {
		sb.mu.Lock()
		sb.watching--
		sb.mu.Unlock()
	}
	if errors.Is(err, syscall.ENOTDIR) {
		return f, "", nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %s is not a directory", echo(p)))
	}
	if err != nil {
		return f, "", nil, fsError(err)
	}
	out := make(chan minipy.FileEvent)
	go func() { // (the watch's place goes back when it ends)
		defer func() {
			sb.mu.Lock()
			sb.watching--
			sb.mu.Unlock()
		}()
		defer close(out)
		for ev := range events {
			select {
			case out <- ev:
			case <-watchCtx.Done():
				for range events { // (it ends with watchCtx)
				}
				return
			}
		}
	}()
	return f, name, out, nil
}

// watchEvent is ev under the directory dir as envd gives it (with its entry, if asked and
// it is there); nil for what envd does not report (lost events).
func watchEvent(f userFiles, dir string, ev minipy.FileEvent, withEntry bool) *filesystem.FilesystemEvent {
	t, ok := watchTypes[ev.Op]
	if !ok {
		return nil
	}
	out := &filesystem.FilesystemEvent{Name: ev.Name, Type: t}
	if withEntry && ev.Op != minipy.FileRemoved && ev.Op != minipy.FileRenamed {
		if fi, err := f.ns.Stat(path.Join(dir, ev.Name), f.opts()...); err == nil {
			out.Entry = entry(f, fi)
		}
	}
	return out
}

func (fss filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	f, dir, events, err := watchOf(ctx, ctx, fss.rootUser, req.Header(), req.Msg.GetPath(), req.Msg.GetRecursive())
	if err != nil {
		return err
	}
	leaveInflight(ctx) // (the engine's bound on watches holds these streams)
	if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{
		Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	tick := time.NewTicker(keepalive)
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return nil
			}
			if fe := watchEvent(f, dir, ev, req.Msg.GetIncludeEntry()); fe != nil {
				if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: fe}}); err != nil {
					return err
				}
			}
		case <-tick.C:
			stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{ //nolint:errcheck // the next send says
				Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}})
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// polledWatch is a watcher that CreateWatcher made: its events until taken.
type polledWatch struct {
	stop   context.CancelFunc
	mu     sync.Mutex
	events []*filesystem.FilesystemEvent
}

func (fss filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	sb := sandboxFrom(ctx)
	watchCtx, stop := context.WithCancel(sb.ctx)
	f, dir, events, err := watchOf(ctx, watchCtx, fss.rootUser, req.Header(), req.Msg.GetPath(), req.Msg.GetRecursive())
	if err != nil {
		stop()
		return nil, err
	}
	w := &polledWatch{stop: stop}
	id := randomID()
	sb.mu.Lock()
	if sb.watchers == nil {
		sb.watchers = map[string]*polledWatch{}
	}
	sb.watchers[id] = w
	sb.mu.Unlock()
	go func() {
		for ev := range events {
			if fe := watchEvent(f, dir, ev, req.Msg.GetIncludeEntry()); fe != nil {
				w.mu.Lock()
				if len(w.events) == maxPolled {
					w.events = w.events[1:]
				}
				w.events = append(w.events, fe)
				w.mu.Unlock()
			}
		}
	}()
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: id}), nil
}

// polled is the sandbox's watcher id, or NotFound.
func polled(ctx context.Context, id string) (*polledWatch, error) {
	sb := sandboxFrom(ctx)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if w := sb.watchers[id]; w != nil {
		return w, nil
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no watcher %s", echo(id)))
}

func (filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	w, err := polled(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	events := w.events
	w.events = nil
	w.mu.Unlock()
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: events}), nil
}

func (filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	w, err := polled(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	w.stop()
	sb := sandboxFrom(ctx)
	sb.mu.Lock()
	delete(sb.watchers, req.Msg.GetWatcherId())
	sb.mu.Unlock()
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}
