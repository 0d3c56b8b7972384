package e2b

import (
	"compress/gzip"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"syscall"

	"github.com/minipy-go/minipy"
)

// envd (port 49983), the sandbox's daemon: its health, and its files' upload and download,
// in the sandbox's working directory (the default context's), which E2B's paths name as
// /home/user.

// Home is the directory that E2B's SDKs name a sandbox's working directory by: paths in it,
// or relative ones, reach the sandbox's working directory.
const Home = "/home/user"

func (s *Server) envdRoutes() {
	s.envd = http.NewServeMux()
	s.envd.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	s.envd.HandleFunc("GET /files", s.download)
	s.envd.HandleFunc("POST /files", s.upload)
	s.filesystemRoutes()
	s.processRoutes()
	s.envd.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, r.Method+" "+echo(r.URL.Path)+" is not part of what minipy serves of envd "+
			"(docs/e2b.md lists what is)")
	})
}

// RootHome is the home of a sandbox's root (E2B's user "root"), where its relative paths
// are.
const RootHome = "/root"

// envdUser is whom an envd request acts as in its sandbox: its signed URL's username, else
// its Authorization header's (E2B's SDKs send "Basic " and the base64 of "NAME:"), else
// envd's default, "user". root is true for "root", which only a server whose sandboxes have
// a root user (rootUser: Config.RootUser) serves; any other name is envd's "invalid
// username".
func envdUser(rootUser bool, h http.Header, q url.Values) (root bool, err error) {
	name := q.Get("username")
	if name == "" {
		if auth, ok := strings.CutPrefix(h.Get("Authorization"), "Basic "); ok {
			if b, err := base64.StdEncoding.DecodeString(auth); err == nil {
				name, _, _ = strings.Cut(string(b), ":")
			}
		}
	}
	switch name {
	case "", "user":
		return false, nil
	case "root":
		if rootUser {
			return true, nil
		}
		return false, errors.New("invalid username: 'root': this server's sandboxes have no root user (it does not " +
			"run as root: docs/e2b.md)")
	}
	return false, fmt.Errorf("invalid username: '%s'", echo(name))
}

// userFiles are a sandbox's file methods as one of its users (envdUser).
type userFiles struct {
	ns   *minipy.Namespace
	root bool
}

// opts are the file methods' options for the user.
func (f userFiles) opts() []minipy.FileOption {
	if f.root {
		return []minipy.FileOption{minipy.AsRoot()}
	}
	return nil
}

// home is the directory the user's relative paths are in.
func (f userFiles) home() string {
	if f.root {
		return RootHome
	}
	return Home
}

// maxPath bounds a path (Linux's PATH_MAX): a longer one is refused before it reaches
// the files, or an error.
const maxPath = 4096

// echo is at most 200 bytes of what a request gave, for an error that repeats it.
func echo(s string) string {
	if len(s) > 200 {
		return strconv.Quote(s[:200]) + "..."
	}
	return s
}

// workPath is an E2B path as a name for the namespace's file methods: a name in the
// working directory for Home, what is under it and a relative path (one relative to home,
// the user's: RootHome for root); the absolute path itself elsewhere, which the file
// methods reach where the sandbox writes (/tmp, /dev/shm, its own root) and refuse in what
// the image mounts there (minipy.ErrBadPath). ok is false for a path past maxPath.
func workPath(p, home string) (string, bool) {
	if len(p) > maxPath || p == "" {
		return "", p == ""
	}
	if !strings.HasPrefix(p, "/") {
		p = path.Join(home, p)
	}
	p = path.Clean(p)
	if p == Home {
		return "", true
	}
	if rest, ok := strings.CutPrefix(p, Home+"/"); ok {
		return rest, true
	}
	return p, true
}

// sandboxPath is the E2B path of a name the file methods gave (workPath's inverse).
func sandboxPath(name string) string {
	if path.IsAbs(name) {
		return name
	}
	return path.Join(Home, name)
}

func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	root, err := envdUser(s.cfg.RootUser, r.Header, r.URL.Query())
	if err != nil {
		writeError(w, http.StatusUnauthorized, err.Error())
		return
	}
	f := userFiles{root: root}
	name, ok := workPath(r.URL.Query().Get("path"), f.home())
	if !ok || name == "" {
		writeError(w, http.StatusBadRequest, "path "+echo(r.URL.Query().Get("path"))+": not a file's path (at most "+
			strconv.Itoa(maxPath)+" bytes)")
		return
	}
	ns := sandboxOf(r).namespace()
	if ns == nil {
		writeError(w, http.StatusBadGateway, "the sandbox is not running")
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	out := &firstWrite{w: w}
	if _, err := ns.ReadFileTo(name, out, f.opts()...); err != nil && !out.wrote {
		fileError(w, err) // (after the first byte, an error is the client's going away)
	}
}

// firstWrite lets a download answer an error until its first byte.
type firstWrite struct {
	w     http.ResponseWriter
	wrote bool
}

func (f *firstWrite) Write(p []byte) (int, error) {
	f.wrote = true
	return f.w.Write(p)
}

// fileError answers a file method's error with envd's status for it.
func fileError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, minipy.ErrBadPath), errors.Is(err, fs.ErrInvalid):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, syscall.ENOSPC):
		writeError(w, http.StatusInsufficientStorage, err.Error())
	case errors.Is(err, minipy.ErrNamespaceClosed):
		writeError(w, http.StatusBadGateway, "the sandbox is not running")
	default:
		writeError(w, http.StatusInternalServerError, err.Error())
	}
}

// entryInfo is envd's description of a file written.
type entryInfo struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// File metadata (envd 0.6.2): an upload's X-Metadata-KEY headers become the written
// files' metadata, kept as their user extended attributes "user.e2b.KEY" (which the
// sandbox's code may set too), and every EntryInfo reports them; an upload without
// metadata clears what the file had. A key is what its header's name holds after the
// prefix, lower-cased (HTTP's header names have no case), and a value printable ASCII.
const (
	metadataHeader = "X-Metadata-"
	metadataPrefix = "e2b."
)

// uploadMetadata is the metadata an upload's headers give, or why it is refused.
func uploadMetadata(h http.Header) (map[string]string, string) {
	var md map[string]string
	for name, values := range h {
		key, ok := strings.CutPrefix(name, metadataHeader)
		if !ok {
			continue
		}
		key = strings.ToLower(key)
		if key == "" || len(values) != 1 || strings.IndexFunc(values[0], func(r rune) bool { return r < 0x20 || r > 0x7e }) >= 0 {
			return nil, "metadata " + echo(key) + ": one value of printable ASCII"
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = values[0]
	}
	return md, ""
}

// upload writes the files of a request: a multipart form's "file" parts (each named by the
// path parameter, else by its file name), or an octet-stream body to the path parameter.
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	root, err := envdUser(s.cfg.RootUser, r.Header, r.URL.Query())
	if err != nil {
		writeError(w, http.StatusUnauthorized, err.Error())
		return
	}
	ns := sandboxOf(r).namespace()
	if ns == nil {
		writeError(w, http.StatusBadGateway, "the sandbox is not running")
		return
	}
	md, why := uploadMetadata(r.Header)
	if why != "" {
		writeError(w, http.StatusBadRequest, why)
		return
	}
	param := r.URL.Query().Get("path")
	if media, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); media != "multipart/form-data" {
		body := io.Reader(r.Body)
		switch r.Header.Get("Content-Encoding") {
		case "", "identity":
		case "gzip": // (a bomb fills the working directory's tmpfs, WorkSize, and no more)
			z, err := gzip.NewReader(r.Body)
			if err != nil {
				writeError(w, http.StatusBadRequest, "the upload's gzip: "+err.Error())
				return
			}
			body = z
		default:
			writeError(w, http.StatusUnsupportedMediaType, "Content-Encoding "+echo(r.Header.Get("Content-Encoding"))+
				": gzip or none")
			return
		}
		if e, ok := s.writeFile(w, userFiles{ns, root}, param, body, md); ok {
			writeJSON(w, http.StatusOK, []entryInfo{e})
		}
		return
	}
	parts, err := r.MultipartReader()
	if err != nil {
		writeError(w, http.StatusBadRequest, "the upload's form: "+err.Error())
		return
	}
	written := []entryInfo{}
	for {
		part, err := parts.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, "the upload's form: "+err.Error())
			return
		}
		if part.FormName() != "file" {
			continue
		}
		target := param
		if target == "" {
			// The part's file name is its path (E2B's SDKs write several files so); Go's
			// FileName keeps only its last element: the header's own, which workPath checks.
			_, disposition, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			target = disposition["filename"]
		}
		e, ok := s.writeFile(w, userFiles{ns, root}, target, part, md)
		if !ok {
			return
		}
		written = append(written, e)
	}
	writeJSON(w, http.StatusOK, written)
}

// writeFile writes one uploaded file with its metadata md, answering the error itself when
// it fails.
func (s *Server) writeFile(w http.ResponseWriter, f userFiles, target string, body io.Reader,
	md map[string]string) (entryInfo, bool) {
	name, ok := workPath(target, f.home())
	if !ok || name == "" {
		writeError(w, http.StatusBadRequest, "path "+echo(target)+": not a file's path (at most "+
			strconv.Itoa(maxPath)+" bytes)")
		return entryInfo{}, false
	}
	if _, err := f.ns.WriteFileFrom(name, body, f.opts()...); err != nil {
		fileError(w, err)
		return entryInfo{}, false
	}
	if err := f.ns.SetFileAttrs(name, metadataPrefix, md, f.opts()...); err != nil {
		fileError(w, err)
		return entryInfo{}, false
	}
	return entryInfo{Name: path.Base(sandboxPath(name)), Type: "file", Path: sandboxPath(name), Metadata: md}, true
}
