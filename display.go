package minipy

import (
	"bytes"
	"fmt"
	"image"
	_ "image/gif"  // image.DecodeConfig of GIF displays
	_ "image/jpeg" // and of JPEG ones (PNG below)
	_ "image/png"
	"strings"
	"unicode/utf8"

	"github.com/minipy-go/minipy/internal/pyrt"
)

// DefaultMaxImages is the cap on images per run when Options.MaxImages is 0.
const DefaultMaxImages = 10

// DefaultMaxImageBytes is the cap on each image's size when Options.MaxImageBytes is 0:
// well under the 5 MB that model APIs take per image, and far over a typical plot (a
// 640x480 matplotlib figure is 20-60 KB).
const DefaultMaxImageBytes = 1 << 20

// Display is one rich output of a run, as Jupyter keeps it: the same object in several
// forms, by MIME type. A display() call, a matplotlib figure, or the run's value when it
// has more than a text form each make one.
type Display struct {
	// Data maps MIME types to raw bytes: "image/png" holds the PNG file itself, text types
	// ("text/plain", "text/html", "text/markdown", "image/svg+xml", "application/json")
	// their UTF-8 text. "text/plain" is always there.
	Data map[string][]byte
	// Value is true for the run's last value (Jupyter's execute_result), false for
	// display() calls and figures (display_data).
	Value bool
	// Offset is where the display happened in the run's output: a byte offset into
	// Result.Stdout, between the text printed before it and the text printed after (just
	// after the omission marker when that part of the output was cut). The run's value,
	// and a display made when no run was writing, are at the end: len(Result.Stdout).
	Offset int
	// Caption is the text a model reads in the display's place (Result.Output,
	// Result.ValueText): "[image 1: PNG 640x480, 23 KB]" for an image, "[image not
	// shown: ...]" for one over the run's limits, else the display's text form. It is
	// empty for a value without an image, whose text is Result.Repr.
	Caption string
}

// Text is the display's text form ("text/plain").
func (d Display) Text() string { return string(d.Data["text/plain"]) }

// Image returns the display's image, if it has one of the types model APIs take (PNG,
// JPEG, GIF, WebP; the first of them present, in that order).
func (d Display) Image() (Image, bool) {
	for _, mime := range pyrt.ImageTypes {
		if data, ok := d.Data[mime]; ok {
			return newImage(mime, data), true
		}
	}
	return Image{}, false
}

// Images returns the images of the run's displays, in order: the Nth is the one the text
// calls "[image N: ...]".
func (r *Result) Images() []Image {
	if r == nil {
		return nil
	}
	var images []Image
	for _, d := range r.Displays {
		if img, ok := d.Image(); ok {
			images = append(images, img)
		}
	}
	return images
}

// Image is an image a run showed, ready to send to a model.
type Image struct {
	// MIMEType is "image/png", "image/jpeg", "image/gif" or "image/webp".
	MIMEType string
	// Data is the image file's bytes.
	Data []byte
	// Width and Height are in pixels; 0 when the format's header could not be read (WebP).
	Width, Height int
}

func newImage(mime string, data []byte) Image {
	img := Image{MIMEType: mime, Data: data}
	if cfg, _, err := image.DecodeConfig(bytes.NewReader(data)); err == nil {
		img.Width, img.Height = cfg.Width, cfg.Height
	}
	return img
}

// String describes the image as the model's text does: "PNG 640x480, 23 KB".
func (img Image) String() string {
	kind := strings.ToUpper(strings.TrimPrefix(img.MIMEType, "image/"))
	dims := ""
	if img.Width > 0 {
		dims = fmt.Sprintf(" %dx%d", img.Width, img.Height)
	}
	return fmt.Sprintf("%s%s, %s", kind, dims, sizeText(len(img.Data)))
}

// sizeText is runtime.py's _size_text: "23 KB", "1.2 MB".
func sizeText(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d KB", max(1, (n+512)/1024))
}

// decodeDisplays converts the reply's displays ([[{mime: str or bytes}, is the value, byte
// offset into stdout or -1, caption], ...] or None) of a run that printed stdout.
func decodeDisplays(v any, stdout string) ([]Display, error) {
	if v == nil {
		return nil, nil
	}
	list, ok := v.([]any)
	if !ok {
		return nil, errTruncated
	}
	displays := make([]Display, 0, len(list))
	for _, item := range list {
		fields, ok := item.([]any)
		if !ok || len(fields) != 4 {
			return nil, errTruncated
		}
		bundle, ok := fields[0].(map[string]any)
		if !ok {
			return nil, errTruncated
		}
		d := Display{Data: make(map[string][]byte, len(bundle))}
		d.Value, _ = fields[1].(bool)
		d.Offset = len(stdout)
		if at, ok := fields[2].(int64); ok && at >= 0 && at < int64(len(stdout)) {
			d.Offset = int(at)
			for d.Offset > 0 && !utf8.RuneStart(stdout[d.Offset]) {
				d.Offset-- // never inside a character (Python counts characters; a byte it could not decode is one)
			}
		}
		d.Caption, _ = fields[3].(string)
		for mime, data := range bundle {
			switch data := data.(type) {
			case string:
				d.Data[mime] = []byte(data)
			case []byte:
				d.Data[mime] = data
			}
		}
		displays = append(displays, d)
	}
	return displays, nil
}
