package minipy

import (
	"bufio"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
)

// A saved namespace, format 2 (docs/state.md): the magic, the version, then frames, each
//
//	kind     1 byte: 'H' the header, 'F' a piece of the files' tar archive, 'V' a piece of
//	         the variables' pickle, 'E' the end (empty), in this order: H F* V+ E
//	length   u32, at most stateFrameMax
//	data     that many bytes
//	tag      32 bytes: HMAC-SHA256, under the state key, of the previous frame's tag (for
//	         the first, the HMAC of the magic and version), the kind, the length and the data
//
// Each frame is checked before anything of it is used, and its tag binds it to every frame
// before it: none can be dropped, moved or replaced, and a save that stops before its 'E'
// is cut. So a save streams both ways: the files go from the working directory to the
// writer, and from the reader to the working directory, a frame at a time, and neither
// side holds more than the variables and a frame.

const (
	stateFrameMax   = 1 << 20   // a frame's data at most
	stateFrameChunk = 256 << 10 // the files' frames Save writes
)

// stateChain is the chain of tags of a saved namespace's frames.
type stateChain struct {
	mac hash.Hash
	tag [sha256.Size]byte
}

func newStateChain(version uint16) *stateChain {
	c := &stateChain{mac: hmac.New(sha256.New, currentStateKey())}
	c.mac.Write([]byte(stateMagic))
	c.mac.Write(binary.LittleEndian.AppendUint16(nil, version))
	c.mac.Sum(c.tag[:0])
	return c
}

// next is the tag of the frame kind, data, after the last one.
func (c *stateChain) next(kind byte, data []byte) [sha256.Size]byte {
	var head [5]byte
	head[0] = kind
	binary.LittleEndian.PutUint32(head[1:], uint32(len(data)))
	c.mac.Reset()
	c.mac.Write(c.tag[:])
	c.mac.Write(head[:])
	c.mac.Write(data)
	c.mac.Sum(c.tag[:0])
	return c.tag
}

// stateWriter writes a saved namespace's frames to w; the first error stays.
type stateWriter struct {
	w     io.Writer
	chain *stateChain
	err   error
}

func newStateWriter(w io.Writer) *stateWriter {
	sw := &stateWriter{w: w, chain: newStateChain(stateFormat)}
	_, sw.err = w.Write(binary.LittleEndian.AppendUint16([]byte(stateMagic), stateFormat))
	return sw
}

// frames writes data as frames of kind, as many as it needs (one, when data is empty).
func (sw *stateWriter) frames(kind byte, data []byte) error {
	for first := true; first || len(data) > 0; first = false {
		n := min(len(data), stateFrameMax)
		sw.frame(kind, data[:n])
		data = data[n:]
	}
	return sw.err
}

func (sw *stateWriter) frame(kind byte, data []byte) {
	if sw.err != nil {
		return
	}
	tag := sw.chain.next(kind, data)
	head := binary.LittleEndian.AppendUint32([]byte{kind}, uint32(len(data)))
	if _, sw.err = sw.w.Write(head); sw.err == nil {
		if _, sw.err = sw.w.Write(data); sw.err == nil {
			_, sw.err = sw.w.Write(tag[:])
		}
	}
}

// frameWriter is an io.Writer whose bytes go out as frames of kind, stateFrameChunk at a
// time (Flush writes the rest).
type frameWriter struct {
	sw   *stateWriter
	kind byte
	buf  []byte
}

func (fw *frameWriter) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		if fw.buf == nil {
			fw.buf = make([]byte, 0, stateFrameChunk)
		}
		k := min(len(b), cap(fw.buf)-len(fw.buf))
		fw.buf = append(fw.buf, b[:k]...)
		b = b[k:]
		if len(fw.buf) == cap(fw.buf) {
			fw.Flush()
		}
		if fw.sw.err != nil {
			return 0, fw.sw.err
		}
	}
	return n, nil
}

func (fw *frameWriter) Flush() error {
	if len(fw.buf) > 0 {
		fw.sw.frame(fw.kind, fw.buf)
		fw.buf = fw.buf[:0]
	}
	return fw.sw.err
}

// stateReader reads a saved namespace's frames, each checked before it is returned.
type stateReader struct {
	r     *bufio.Reader
	chain *stateChain
	ahead *stateFrame // a frame read but not taken (peek)
	buf   []byte
}

type stateFrame struct {
	kind byte
	data []byte // valid until the next read
}

// errStateCut is a frame's read that found the input's end.
func errStateCut(what string) error {
	return fmt.Errorf("%w: cut short (in %s)", ErrBadState, what)
}

// next reads the next frame; io.EOF at the input's end, right after a frame.
func (sr *stateReader) next() (stateFrame, error) {
	if f := sr.ahead; f != nil {
		sr.ahead = nil
		return *f, nil
	}
	var head [5]byte
	if _, err := io.ReadFull(sr.r, head[:]); err != nil {
		if err == io.EOF {
			return stateFrame{}, io.EOF
		}
		return stateFrame{}, stateReadError(err, "a frame's head")
	}
	n := binary.LittleEndian.Uint32(head[1:])
	if n > stateFrameMax {
		return stateFrame{}, fmt.Errorf("%w: a frame of %d bytes, past %d", ErrBadState, n, stateFrameMax)
	}
	if cap(sr.buf) < int(n)+sha256.Size {
		sr.buf = make([]byte, int(n)+sha256.Size)
	}
	b := sr.buf[:int(n)+sha256.Size]
	if _, err := io.ReadFull(sr.r, b); err != nil {
		return stateFrame{}, stateReadError(err, fmt.Sprintf("a frame %q", head[0]))
	}
	want := sr.chain.next(head[0], b[:n])
	if !hmac.Equal(want[:], b[n:]) {
		return stateFrame{}, ErrStateTag
	}
	return stateFrame{kind: head[0], data: b[:n]}, nil
}

// stateReadError is ErrBadState for a read that ended early, else the reader's error.
func stateReadError(err error, what string) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errStateCut(what)
	}
	return fmt.Errorf("minipy: Restore: reading: %w", err)
}

// peek is the kind of the next frame (0 at the input's end).
func (sr *stateReader) peek() (byte, error) {
	f, err := sr.next()
	if err == io.EOF {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	sr.ahead = &f
	return f.kind, nil
}

// frameReader reads the data of the frames of kind that come next, as one stream.
type frameReader struct {
	sr   *stateReader
	kind byte
	rest []byte
	err  error
}

func (fr *frameReader) Read(b []byte) (int, error) {
	for len(fr.rest) == 0 && fr.err == nil {
		kind, err := fr.sr.peek()
		switch {
		case err != nil:
			fr.err = err
		case kind != fr.kind:
			fr.err = io.EOF
		default:
			f, _ := fr.sr.next()
			fr.rest = f.data
		}
	}
	if len(fr.rest) == 0 {
		return 0, fr.err
	}
	n := copy(b, fr.rest)
	fr.rest = fr.rest[n:]
	return n, nil
}
