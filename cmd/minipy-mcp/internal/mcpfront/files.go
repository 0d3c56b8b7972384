package mcpfront

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/url"
	"path"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/minipy-go/minipy"
)

// A session's files (the working directory of its namespace, on an isolated engine with
// local workers) are MCP resources: a run's result links the files it created or changed
// after its text, resources/list lists them all, and resources/read returns one. They are
// the session's own: every request reads the namespace of the session it came on, and
// with -tokens a session is its user's.
const (
	// fileScheme starts the URI of a session's file: fileScheme + its path in the working
	// directory (the code's current directory when a run starts, /work in the sandbox).
	// Not file://, which a client would read from its own disk.
	fileScheme = "minipy://files/"
	// listPage is how many files one resources/list answer holds.
	listPage = 200
	// listMax bounds the files resources/list walks through, all pages together, so that
	// a tree of millions costs a bounded walk.
	listMax = 10000
	// DefaultMaxResourceSize is what resources/read returns at most of a file by default
	// (-max-resource-size's default).
	DefaultMaxResourceSize = 8 << 20
)

// fileURI is the resource URI of the file name (a path in the working directory).
func fileURI(name string) string {
	return fileScheme + (&url.URL{Path: name}).EscapedPath()
}

// fileName is the file of a resource URI, or "" if the URI is not one of ours.
func fileName(uri string) string {
	rest, ok := strings.CutPrefix(uri, fileScheme)
	if !ok {
		return ""
	}
	name, err := url.PathUnescape(rest)
	if err != nil {
		return ""
	}
	return name
}

// fileLinks are a run's changed files as resource links, and a line about those left out.
func fileLinks(res minipy.ToolResult) (links []mcp.Content, note string) {
	for _, f := range res.Files {
		size := f.Size
		links = append(links, &mcp.ResourceLink{URI: fileURI(f.Name), Name: f.Name, MIMEType: mimeType(f.Name), Size: &size})
	}
	switch {
	case res.MoreFiles == minipy.MoreFilesUnknown:
		note = "[files: more changed files may not be linked; resources/list lists them]\n"
	case res.MoreFiles > 0:
		note = fmt.Sprintf("[files: %d more changed files are not linked; resources/list lists them]\n", res.MoreFiles)
	}
	return links, note
}

// mimeType guesses a file's type from its name: the types of files that code interpreters
// make, the same on every machine, then the system's table (mime.TypeByExtension); "" if
// neither knows it.
func mimeType(name string) string {
	ext := strings.ToLower(path.Ext(name))
	if t, ok := fileTypes[ext]; ok {
		return t
	}
	t, _, _ := strings.Cut(mime.TypeByExtension(ext), ";")
	return t
}

var fileTypes = map[string]string{
	".txt": "text/plain", ".log": "text/plain", ".md": "text/markdown", ".py": "text/x-python",
	".csv": "text/csv", ".tsv": "text/tab-separated-values", ".html": "text/html", ".htm": "text/html",
	".json": "application/json", ".jsonl": "application/jsonl", ".ipynb": "application/x-ipynb+json",
	".xml": "application/xml", ".yaml": "application/yaml", ".yml": "application/yaml",
	".svg": "image/svg+xml", ".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
	".webp": "image/webp", ".pdf": "application/pdf", ".zip": "application/zip", ".gz": "application/gzip",
	".parquet": "application/vnd.apache.parquet", ".npy": "application/x-npy", ".pkl": "application/octet-stream",
	".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet", ".bin": "application/octet-stream",
}

// addFileResources serves the sessions' files: a template for resources/read, and a
// middleware that answers resources/list with the session's own files (the SDK's list is
// the server's, the same for every session).
func (s *sessions) addFileResources(server *mcp.Server) {
	server.AddResourceTemplate(&mcp.ResourceTemplate{
		Name:        "files",
		Title:       "Working directory",
		Description: "The files of this session's Python working directory: what the code wrote, and what it may read.",
		URITemplate: fileScheme + "{+path}",
	}, s.readFile)
	server.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method != "resources/list" {
				return next(ctx, method, req)
			}
			ss, _ := req.GetSession().(*mcp.ServerSession)
			cursor := ""
			if p, ok := req.GetParams().(*mcp.ListResourcesParams); ok && p != nil {
				cursor = p.Cursor
			}
			return s.listFiles(ss, cursor)
		}
	})
}

// listFiles lists the session's files, recursively, sorted by name, but for hidden ones
// (FileInfo.Hidden): a page of listPage after the file the cursor names.
func (s *sessions) listFiles(ss *mcp.ServerSession, cursor string) (*mcp.ListResourcesResult, error) {
	res := &mcp.ListResourcesResult{Resources: []*mcp.Resource{}}
	ns := s.existing(ss)
	if ns == nil {
		return res, nil // no run yet: no files
	}
	after := ""
	if cursor != "" {
		if after = fileName(cursor); after == "" {
			return nil, fmt.Errorf("resources/list: invalid cursor %q", cursor)
		}
	}
	var files []minipy.FileInfo
	var walk func(dir string) error
	walk = func(dir string) error {
		list, err := ns.ListFiles(dir)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, minipy.ErrBadPath) {
				return nil // gone meanwhile, or a link the code made
			}
			return err
		}
		for _, f := range list {
			if len(files) == listMax {
				return nil
			}
			if f.Hidden() {
				continue // caches and settings of the code's libraries (HOME is the working directory)
			}
			if f.IsDir {
				if err := walk(f.Name); err != nil {
					return err
				}
			} else {
				files = append(files, f)
			}
		}
		return nil
	}
	if err := walk(""); err != nil {
		return nil, fmt.Errorf("resources/list: %w", err)
	}
	slices.SortFunc(files, func(a, b minipy.FileInfo) int { return strings.Compare(a.Name, b.Name) })
	i, _ := slices.BinarySearchFunc(files, after, func(f minipy.FileInfo, name string) int {
		if f.Name <= name {
			return -1
		}
		return 1
	})
	for _, f := range files[i:] {
		if len(res.Resources) == listPage {
			res.NextCursor = fileURI(res.Resources[listPage-1].Name)
			break
		}
		res.Resources = append(res.Resources, &mcp.Resource{URI: fileURI(f.Name), Name: f.Name,
			MIMEType: mimeType(f.Name), Size: f.Size})
	}
	return res, nil
}

// readFile is resources/read of a session's file: text when it is UTF-8 text, else a blob;
// a file over maxResourceSize is refused with an error that says so.
func (s *sessions) readFile(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	name := fileName(uri)
	ns := s.existing(req.Session)
	if name == "" || ns == nil {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	var buf capped
	buf.limit = s.maxResourceSize
	if _, err := ns.ReadFileTo(name, &buf); err != nil {
		switch {
		case errors.Is(err, errTooBig):
			return nil, fmt.Errorf("%s is larger than %d bytes, the most resources/read returns here "+
				"(minipy-mcp -max-resource-size): have the code summarize or split it", name, s.maxResourceSize)
		case errors.Is(err, fs.ErrNotExist), errors.Is(err, minipy.ErrBadPath), errors.Is(err, fs.ErrInvalid):
			return nil, mcp.ResourceNotFoundError(uri)
		}
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	typ := mimeType(name)
	data := buf.data
	if utf8.Valid(data) && !strings.ContainsRune(string(data), 0) && (typ == "" || textual(typ)) {
		if typ == "" {
			typ = "text/plain"
		}
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: typ, Text: string(data)}}}, nil
	}
	if typ == "" {
		typ = "application/octet-stream"
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: typ, Blob: data}}}, nil
}

// textual reports a MIME type whose content is text.
func textual(typ string) bool {
	return strings.HasPrefix(typ, "text/") || strings.HasSuffix(typ, "+json") || strings.HasSuffix(typ, "+xml") ||
		typ == "application/json" || typ == "application/xml" || typ == "application/javascript" ||
		typ == "image/svg+xml"
}

var errTooBig = errors.New("over the size limit")

// capped is a buffer that refuses to grow past limit.
type capped struct {
	data  []byte
	limit int64
}

func (c *capped) Write(p []byte) (int, error) {
	if int64(len(c.data)+len(p)) > c.limit {
		return 0, errTooBig
	}
	c.data = append(c.data, p...)
	return len(p), nil
}

var _ io.Writer = (*capped)(nil)
