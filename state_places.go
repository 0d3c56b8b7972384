package minipy

import (
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/minipy-go/minipy/internal/sandboxfs"
)

// A saved namespace holds the rest of its sandbox's writable layer too: after the working
// directory's files (frames 'F'), those of the sandbox's other places, /tmp, /dev/shm and
// its root (files_places.go), as one tar archive in frames 'P' whose names are relative to
// the sandbox's root ("tmp/repo/.git/HEAD", "dev/shm/x", "app/main.py"). What the image
// put at the root is left out (a link there to a mount: /bin -> usr/bin; a directory that
// holds nothing but mounts: /home), and what is mounted there (the image's /usr, /etc) is
// never reached. Only a
// namespace with a sandbox of its own has places (placeOf); a Restore into one that has
// none (in-process, a Fork copy, a packed one, Command workers) leaves them out, as a new
// worker would start without them.

// savePlaces writes the files of the sandbox's places besides its working directory to sw
// as frames 'P', and returns the number of entries.
func (ns *Namespace) savePlaces(sw *stateWriter) (int, error) {
	e, b, _, _, err := ns.placeOf("save", "/", true)
	if err != nil {
		return 0, nil // no sandbox of its own
	}
	root, err := e.sandboxRoot(b)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	pw := &frameWriter{sw: sw, kind: 'P'}
	s := sandboxfs.NewTarSink(pw)
	for _, place := range sandboxPlaces {
		r, err := e.placeIn(root, place, e.keeper())
		if err != nil {
			return s.Entries(), fmt.Errorf("the sandbox's %s: %w", place, err)
		}
		s.Prefix, s.ImageLink = place[1:], nil
		if place == "/" {
			s.ImageLink = func(rel, to string) bool { return imageLink(r, rel, to) }
		}
		err = sandboxfs.Walk(r, ".", s)
		r.Close()
		if err != nil {
			return s.Entries(), fmt.Errorf("the sandbox's %s: %w", place, err)
		}
	}
	if s.Entries() == 0 {
		return 0, nil // (no frame)
	}
	if err := s.Close(); err != nil {
		return s.Entries(), err
	}
	return s.Entries(), pw.Flush()
}

// imageLink reports whether the link rel to to, which the walk of the sandbox's root r
// found, is the image's: a link at the root to a mount there (/bin -> usr/bin). The
// sandbox's own view decides, never the host's files: what the host has is not the code's
// to learn by what a save keeps.
func imageLink(r *sandboxfs.Root, rel, to string) bool {
	if strings.Contains(rel, "/") {
		return false
	}
	top, _, _ := strings.Cut(strings.TrimLeft(path.Clean(to), "/"), "/")
	return top != "" && top != "." && top != ".." && r.MountedAt(top)
}

// restorePlaces writes the frames 'P' that sr reads next (none: nothing) into the sandbox's
// places, each entry into the place its name is under as an absolute name (placeName); an
// entry under a mount of the root (the image's) is left out. It says whether it wrote any.
func (ns *Namespace) restorePlaces(sr *stateReader) (bool, error) {
	if kind, err := sr.peek(); err != nil || kind != 'P' {
		return false, err
	}
	pr := &frameReader{sr: sr, kind: 'P'}
	e, b, _, _, err := ns.placeOf("restore", "/", true)
	if err != nil { // no sandbox of its own: checked all the same, never written
		_, err := io.Copy(io.Discard, pr)
		return false, err
	}
	p := &placeWriter{e: e, b: b, roots: map[string]*sandboxfs.Root{}, mounted: map[string]bool{}}
	defer p.close()
	err = sandboxfs.UntarEntries(pr, p.rootFor)
	if err == nil {
		_, err = io.Copy(io.Discard, pr) // (the archive's padding)
	}
	if err != nil && p.root != nil {
		return true, fmt.Errorf("minipy: Restore: not all of the sandbox's files are written: %w", err)
	}
	return p.root != nil, err
}

// placeWriter opens a sandbox's places as a restore needs them.
type placeWriter struct {
	e       *Isolated
	b       *nsBinding
	root    *os.File
	roots   map[string]*sandboxfs.Root
	opened  []*sandboxfs.Root // (closed last opened first: each holds its thread's fsuid)
	mounted map[string]bool
}

// rootFor gives the place of the entry name (relative to the sandbox's root) and its name
// there; none for a name in the working directory's place, under a mount, or a place itself.
func (p *placeWriter) rootFor(name string) (*sandboxfs.Root, string, error) {
	place, rel, ok := placeName(p.e.cfg.WorkDirPath, "/"+name)
	if !ok || place == p.e.cfg.WorkDirPath || rel == "." {
		return nil, "", nil
	}
	if p.root == nil {
		root, err := p.e.sandboxRoot(p.b)
		if err != nil {
			return nil, "", err
		}
		p.root = root
	}
	r := p.roots[place]
	if r == nil {
		var err error
		if r, err = p.e.placeIn(p.root, place, p.e.keeper()); err != nil {
			return nil, "", fmt.Errorf("the sandbox's %s: %w", place, err)
		}
		p.roots[place] = r
		p.opened = append(p.opened, r)
	}
	if place == "/" {
		top, _, _ := strings.Cut(rel, "/")
		m, seen := p.mounted[top]
		if !seen {
			m = r.MountedAt(top)
			p.mounted[top] = m
		}
		if m {
			return nil, "", nil
		}
	}
	return r, path.Clean(rel), nil
}

func (p *placeWriter) close() {
	for i := len(p.opened) - 1; i >= 0; i-- {
		p.opened[i].Close()
	}
	if p.root != nil {
		p.root.Close()
	}
}
