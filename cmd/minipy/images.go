package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/minipy-go/minipy"
)

// imageSaver writes the images runs show into --save-images' directory.
type imageSaver struct {
	dir string
	// last is the number of the last file written: files count on across the process's
	// runs (the REPL's cells), so that a run never replaces what an earlier one saved.
	last int
}

// savedImage is an image of a run and where it went.
type savedImage struct {
	display int // its index in Result.Displays
	n       int // its number in the run's text, "[image N: ...]"
	img     minipy.Image
	path    string
}

// save writes res's images, in order, and returns what it wrote (up to an error). A nil
// saver (no --save-images) writes nothing.
func (s *imageSaver) save(res *minipy.Result) ([]savedImage, error) {
	if s == nil || res == nil {
		return nil, nil
	}
	var saved []savedImage
	n := 0
	for i, d := range res.Displays {
		img, ok := d.Image()
		if !ok {
			continue
		}
		n++
		if n == 1 {
			// Created on the first image, not up front: runs without images leave no trace.
			if err := os.MkdirAll(s.dir, 0o755); err != nil {
				return saved, err
			}
		}
		path, err := s.write(img)
		if err != nil {
			return saved, err
		}
		saved = append(saved, savedImage{display: i, n: n, img: img, path: path})
	}
	return saved, nil
}

// write puts img in the directory under the next free number: O_EXCL makes a file that is
// already there (from an earlier process, or another one now) skip its number instead of
// being overwritten.
func (s *imageSaver) write(img minipy.Image) (string, error) {
	for {
		s.last++
		path := filepath.Join(s.dir, fmt.Sprintf("image-%d.%s", s.last, imageExt(img.MIMEType)))
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if os.IsExist(err) {
			continue
		}
		if err != nil {
			return "", err
		}
		_, err = f.Write(img.Data)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(path) //nolint:errcheck // a partial image is worse than none
			return "", err
		}
		return path, nil
	}
}

// imageExt is the file extension for an image type (those minipy.Image has).
func imageExt(mime string) string {
	switch mime {
	case "image/jpeg":
		return "jpg"
	}
	return strings.TrimPrefix(mime, "image/") // png, gif, webp
}

// saveAndReport saves res's images and says on errOut where each went, naming it as the
// output did ("image 2" is "[image 2: ...]"). It returns false when saving failed.
func (s *imageSaver) saveAndReport(res *minipy.Result, errOut *tailWriter) bool {
	saved, err := s.save(res)
	if len(saved) > 0 || err != nil {
		errOut.startLine()
	}
	for _, si := range saved {
		fmt.Fprintf(errOut, "minipy: saved image %d (%s) to %s\n", si.n, si.img, si.path)
	}
	if err != nil {
		fmt.Fprintf(errOut, "minipy: saving images: %v\n", err)
		return false
	}
	return true
}

// isTextMIME reports whether display data of this MIME type is text, which --json gives as
// a string; the rest (images, PDF, anything else) is binary and goes base64-encoded. This
// is the rule of Jupyter's nbformat, so a display reads the same as in a notebook file.
func isTextMIME(mime string) bool {
	mime, _, _ = strings.Cut(mime, ";") // "text/plain; charset=utf-8"
	mime = strings.ToLower(strings.TrimSpace(mime))
	switch {
	case strings.HasPrefix(mime, "text/"),
		mime == "application/json", mime == "application/javascript",
		strings.HasSuffix(mime, "+json"), strings.HasSuffix(mime, "+xml"): // image/svg+xml too
		return true
	}
	return false
}
