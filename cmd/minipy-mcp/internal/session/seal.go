package session

// Sealing: what a store keeps of a session is encrypted and authenticated (AES-256-GCM,
// under a key derived from the state key), over everything a resume trusts. A save is its
// head (its meta: user, what its front needs to bring it back, when, its id) and its blob
// (the namespaces' saves, an E2B sandbox's description), each sealed with a nonce of its
// own; the head's additional data binds it to the deployment (StoreOptions.Prefix) and the
// kind, the blob's to the deployment, the kind, the session's id, its user and its head.
// Someone who can write the store but does not hold the key can neither read a save nor
// move one to another session, user, kind or deployment, nor change its meta: a save that
// does not open is damaged, and not found.

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
)

// errDamaged: a save that does not open (another key's, another session's, changed).
var errDamaged = errors.New("it does not open with this store's key: changed, moved from another session, or " +
	"another deployment's")

// newSeal is the AEAD of key (a secret of the store's: Derive's).
func newSeal(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// headAAD and blobAAD are the additional data of a save's head and blob.
func (d *Store) headAAD(kind string) []byte {
	return []byte("minipy-mcp save head\x00" + d.o.Prefix + "\x00" + kind)
}

func (d *Store) blobAAD(kind, id, user string, headNonce []byte) []byte {
	return append([]byte("minipy-mcp save blob\x00"+d.o.Prefix+"\x00"+kind+"\x00"+id+"\x00"+user+"\x00"), headNonce...)
}

// seal is nonce || AEAD(data, aad).
func (d *Store) seal(data, aad []byte) []byte {
	out := make([]byte, d.aead.NonceSize(), d.aead.NonceSize()+len(data)+d.aead.Overhead())
	rand.Read(out) //nolint:errcheck // crypto/rand.Read does not fail
	return d.aead.Seal(out, out, data, aad)
}

// open opens what seal made: its plaintext and its nonce.
func (d *Store) open(sealed, aad []byte) (data, nonce []byte, err error) {
	n := d.aead.NonceSize()
	if len(sealed) < n+d.aead.Overhead() {
		return nil, nil, errDamaged
	}
	data, err = d.aead.Open(nil, sealed[:n], sealed[n:], aad)
	if err != nil {
		return nil, nil, errDamaged
	}
	return data, sealed[:n], nil
}

// sealHead is a save's head: the sealed meta's length (4 bytes, little endian), then it. It
// returns the head's nonce too, which the blob's seal binds.
func (d *Store) sealHead(kind string, meta Meta) (head, nonce []byte, err error) {
	js, err := json.Marshal(meta)
	if err != nil {
		return nil, nil, err
	}
	sealed := d.seal(js, d.headAAD(kind))
	head = binary.LittleEndian.AppendUint32(nil, uint32(len(sealed)))
	return append(head, sealed...), sealed[:d.aead.NonceSize()], nil
}

// openHead reads the meta at the start of a save (a head, or a head and its blob): the
// meta, where the blob starts, and the head's nonce.
func (d *Store) openHead(kind string, data []byte) (meta Meta, n int, nonce []byte, err error) {
	if len(data) < 4 {
		return meta, 0, nil, errors.New("cut short")
	}
	length := int64(binary.LittleEndian.Uint32(data))
	if length > int64(len(data)-4) {
		return meta, 0, nil, errors.New("cut short")
	}
	js, nonce, err := d.open(data[4:4+length], d.headAAD(kind))
	if err != nil {
		return meta, 0, nil, err
	}
	if err := json.Unmarshal(js, &meta); err != nil {
		return meta, 0, nil, err
	}
	return meta, 4 + int(length), nonce, nil
}

// A blob of format blobSegmented (Meta.Format) is sealed in segments, so that it streams
// both ways: a 12-byte random base nonce, then segments, each a flag byte (1: the last), a
// u32 length and the AES-GCM of at most segmentSize bytes, whose nonce is the base with
// the segment's number and flag xored into its last 8 bytes. No segment can be dropped,
// moved or made the last, and a blob that stops before its last is cut: damaged. Each is
// opened before its bytes are given out.
const (
	blobSegmented = 2
	segmentSize   = 64 << 10
)

// segmentNonce is the nonce of segment i (last: the blob's last) of the blob of base.
func segmentNonce(base []byte, i uint64, last bool) []byte {
	nonce := append([]byte(nil), base...)
	tail := binary.BigEndian.Uint64(nonce[len(nonce)-8:])
	flag := uint64(0)
	if last {
		flag = 1
	}
	binary.BigEndian.PutUint64(nonce[len(nonce)-8:], tail^(i<<1|flag))
	return nonce
}

// sealWriter seals what is written to it as a segmented blob into w; Close seals the last
// segment (Write holds back a full segment until more comes, so the last is marked).
type sealWriter struct {
	aead cipher.AEAD
	w    io.Writer
	aad  []byte
	base []byte
	i    uint64
	buf  []byte
	out  []byte // (the sealed segment, reused)
	err  error
}

func (d *Store) sealWriter(w io.Writer, aad []byte) *sealWriter {
	s := &sealWriter{aead: d.aead, w: w, aad: aad, base: make([]byte, d.aead.NonceSize()),
		buf: make([]byte, 0, segmentSize)}
	rand.Read(s.base) //nolint:errcheck // crypto/rand.Read does not fail
	_, s.err = w.Write(s.base)
	return s
}

func (s *sealWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 && s.err == nil {
		if len(s.buf) == segmentSize {
			s.segment(false)
		}
		k := min(len(p), segmentSize-len(s.buf))
		s.buf = append(s.buf, p[:k]...)
		p = p[k:]
	}
	if s.err != nil {
		return 0, s.err
	}
	return n, nil
}

func (s *sealWriter) Close() error {
	if s.err == nil {
		s.segment(true)
	}
	return s.err
}

func (s *sealWriter) segment(last bool) {
	flag := byte(0)
	if last {
		flag = 1
	}
	// One write a segment: its head, then it sealed in place after it.
	s.out = append(s.out[:0], flag, 0, 0, 0, 0)
	s.out = s.aead.Seal(s.out, segmentNonce(s.base, s.i, last), s.buf, s.aad)
	binary.LittleEndian.PutUint32(s.out[1:], uint32(len(s.out)-5))
	_, s.err = s.w.Write(s.out)
	s.i++
	s.buf = s.buf[:0]
}

// openReader opens a segmented blob as it reads it from r.
type openReader struct {
	aead  cipher.AEAD
	r     io.Reader
	aad   []byte
	base  []byte
	i     uint64
	plain []byte
	buf   []byte // (the sealed segment, opened in place)
	done  bool
	err   error
}

func (d *Store) openReader(r io.Reader, aad []byte) *openReader {
	return &openReader{aead: d.aead, r: r, aad: aad}
}

func (o *openReader) Read(p []byte) (int, error) {
	for len(o.plain) == 0 && o.err == nil {
		o.err = o.next()
	}
	if len(o.plain) == 0 {
		return 0, o.err
	}
	n := copy(p, o.plain)
	o.plain = o.plain[n:]
	return n, nil
}

// next opens the next segment into plain; io.EOF after the last one, if nothing follows.
func (o *openReader) next() error {
	if o.done {
		var one [1]byte
		if n, _ := io.ReadFull(o.r, one[:]); n > 0 {
			return errDamaged // (bytes after the last segment)
		}
		return io.EOF
	}
	if o.base == nil {
		o.base = make([]byte, o.aead.NonceSize())
		if _, err := io.ReadFull(o.r, o.base); err != nil {
			return cutOrError(err)
		}
	}
	var head [5]byte
	if _, err := io.ReadFull(o.r, head[:]); err != nil {
		return cutOrError(err)
	}
	n := binary.LittleEndian.Uint32(head[1:])
	if head[0] > 1 || n > uint32(segmentSize+o.aead.Overhead()) {
		return errDamaged
	}
	if cap(o.buf) < int(n) {
		o.buf = make([]byte, segmentSize+o.aead.Overhead())
	}
	sealed := o.buf[:n]
	if _, err := io.ReadFull(o.r, sealed); err != nil {
		return cutOrError(err)
	}
	plain, err := o.aead.Open(sealed[:0], segmentNonce(o.base, o.i, head[0] == 1), sealed, o.aad)
	if err != nil {
		return errDamaged
	}
	o.i++
	o.done = head[0] == 1
	o.plain = plain
	return nil
}

// cutOrError is errDamaged for a blob that ended early, else the read's error.
func cutOrError(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errDamaged
	}
	return err
}
