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
