// Command estargz-conformance drives the reference Go estargz library (stargz-snapshotter v0.12,
// from Debian) so Starling's tests can check compatibility in both directions.
//
//	build -in TAR -out BLOB [-chunk-size N] [-level N] [-prioritized FILE] [-zstd]
//	    estargz.Build; prints {"tocDigest","diffID","digest","size"} as JSON. With -zstd the
//	    blob is zstd:chunked (zstdchunked.Compressor at -level as a zstd EncoderLevel, as the
//	    converter uses SpeedDefault = 2) and the JSON adds the manifest checksum/position.
//	append -in TAR -out BLOB [-chunk-size N] [-level N]
//	    single estargz.Writer + AppendTar (no landmark, no reordering); prints the same JSON.
//	verify-and-dump -blob BLOB -toc-digest D
//	    estargz.Open + VerifyTOC, then reads every regular file lazily chunk by chunk, checking
//	    each chunk against its verifier; prints one JSON line per TOC entry. Opens eStargz and
//	    zstd:chunked blobs alike.
package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/containerd/stargz-snapshotter/estargz/zstdchunked"
	"github.com/klauspost/compress/zstd"
	digest "github.com/opencontainers/go-digest"
)

// zstdCompression pairs the zstd:chunked compressor and decompressor as estargz.Compression.
type zstdCompression struct {
	*zstdchunked.Decompressor
	*zstdchunked.Compressor
}

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("usage: estargz-conformance build|append|verify-and-dump [flags]"))
	}
	var err error
	switch os.Args[1] {
	case "build":
		err = build(os.Args[2:])
	case "append":
		err = appendTar(os.Args[2:])
	case "verify-and-dump":
		err = verifyAndDump(os.Args[2:])
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "estargz-conformance:", err)
	os.Exit(1)
}

type buildResult struct {
	TOCDigest string `json:"tocDigest"`
	DiffID    string `json:"diffID"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
	// zstd:chunked only: the io.containers.zstd-chunked.manifest-* annotation values.
	ManifestChecksum string `json:"manifestChecksum,omitempty"`
	ManifestPosition string `json:"manifestPosition,omitempty"`
}

func build(args []string) error {
	fs := flag.NewFlagSet("build", flag.ExitOnError)
	in := fs.String("in", "", "input tar or tar.gz")
	out := fs.String("out", "", "output eStargz blob")
	chunkSize := fs.Int("chunk-size", 0, "chunk size in bytes (0: library default)")
	level := fs.Int("level", 9, "gzip level")
	prioritized := fs.String("prioritized", "", "file listing prioritized paths, one per line")
	useZstd := fs.Bool("zstd", false, "build zstd:chunked")
	fs.Parse(args)

	f, err := os.Open(*in)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	opts := []estargz.Option{estargz.WithChunkSize(*chunkSize), estargz.WithCompressionLevel(*level)}
	if *prioritized != "" {
		files, err := readLines(*prioritized)
		if err != nil {
			return err
		}
		opts = append(opts, estargz.WithPrioritizedFiles(files))
	}
	metadata := map[string]string{}
	if *useZstd {
		opts = append(opts, estargz.WithCompression(&zstdCompression{
			new(zstdchunked.Decompressor),
			&zstdchunked.Compressor{CompressionLevel: zstd.EncoderLevel(*level), Metadata: metadata},
		}))
	}
	blob, err := estargz.Build(io.NewSectionReader(f, 0, st.Size()), opts...)
	if err != nil {
		return err
	}
	defer blob.Close()
	res, err := writeCounted(*out, blob)
	if err != nil {
		return err
	}
	res.TOCDigest = blob.TOCDigest().String()
	res.DiffID = blob.DiffID().String() // valid once the blob has been read to the end
	res.ManifestChecksum = metadata[zstdchunked.ManifestChecksumAnnotation]
	res.ManifestPosition = metadata[zstdchunked.ManifestPositionAnnotation]
	return json.NewEncoder(os.Stdout).Encode(res)
}

func appendTar(args []string) error {
	fs := flag.NewFlagSet("append", flag.ExitOnError)
	in := fs.String("in", "", "input tar or tar.gz")
	out := fs.String("out", "", "output eStargz blob")
	chunkSize := fs.Int("chunk-size", 0, "chunk size in bytes (0: library default)")
	level := fs.Int("level", 9, "gzip level")
	fs.Parse(args)

	src, err := os.Open(*in)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.Create(*out)
	if err != nil {
		return err
	}
	defer dst.Close()
	w := estargz.NewWriterLevel(dst, *level)
	w.ChunkSize = *chunkSize
	if err := w.AppendTar(bufio.NewReader(src)); err != nil {
		return err
	}
	tocDigest, err := w.Close()
	if err != nil {
		return err
	}
	if err := dst.Sync(); err != nil {
		return err
	}
	res, err := digestFile(*out)
	if err != nil {
		return err
	}
	res.TOCDigest = tocDigest.String()
	res.DiffID = w.DiffID()
	return json.NewEncoder(os.Stdout).Encode(res)
}

type dumpEntry struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Size     int64             `json:"size"`
	LinkName string            `json:"linkName,omitempty"`
	Mode     int64             `json:"mode"`
	UID      int               `json:"uid"`
	GID      int               `json:"gid"`
	DevMajor int               `json:"devMajor,omitempty"`
	DevMinor int               `json:"devMinor,omitempty"`
	Xattrs   map[string]string `json:"xattrs,omitempty"`
	ModTime  int64             `json:"modtime"`
	// SHA256 is the hex digest of the content read through the lazy reader (regular files).
	SHA256 string `json:"sha256,omitempty"`
	// Chunks is how many chunks were verified against the TOC's chunk digests.
	Chunks int `json:"chunks,omitempty"`
}

func verifyAndDump(args []string) error {
	fs := flag.NewFlagSet("verify-and-dump", flag.ExitOnError)
	blobPath := fs.String("blob", "", "eStargz blob")
	tocDigest := fs.String("toc-digest", "", "expected TOC digest")
	fs.Parse(args)

	f, err := os.Open(*blobPath)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	r, err := estargz.Open(io.NewSectionReader(f, 0, st.Size()), estargz.WithDecompressors(new(zstdchunked.Decompressor)))
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	want, err := digest.Parse(*tocDigest)
	if err != nil {
		return err
	}
	verifiers, err := r.VerifyTOC(want)
	if err != nil {
		return fmt.Errorf("verify TOC: %w", err)
	}
	// Walk the tree from the root so implicit directories and hardlink resolution are exercised.
	out := json.NewEncoder(os.Stdout)
	root, ok := r.Lookup("")
	if !ok {
		return fmt.Errorf("no root directory")
	}
	var walk func(dir string, e *estargz.TOCEntry) error
	walk = func(name string, e *estargz.TOCEntry) error {
		if name != "" {
			d, err := describe(r, verifiers, name, e)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if err := out.Encode(d); err != nil {
				return err
			}
		}
		var names []string
		e.ForeachChild(func(base string, _ *estargz.TOCEntry) bool {
			names = append(names, base)
			return true
		})
		sort.Strings(names)
		for _, base := range names {
			child, _ := e.LookupChild(base)
			childName := base
			if name != "" {
				childName = name + "/" + base
			}
			if err := walk(childName, child); err != nil {
				return err
			}
		}
		return nil
	}
	return walk("", root)
}

func describe(r *estargz.Reader, verifiers estargz.TOCEntryVerifier, name string, e *estargz.TOCEntry) (*dumpEntry, error) {
	d := &dumpEntry{
		Name: name, Type: e.Type, Size: e.Size, LinkName: e.LinkName, Mode: e.Mode,
		UID: e.UID, GID: e.GID, DevMajor: e.DevMajor, DevMinor: e.DevMinor,
		ModTime: e.ModTime().Unix(),
	}
	if e.ModTime().IsZero() {
		d.ModTime = 0
	}
	if len(e.Xattrs) > 0 {
		d.Xattrs = map[string]string{}
		for k, v := range e.Xattrs {
			d.Xattrs[k] = string(v)
		}
	}
	if e.Type != "reg" {
		return d, nil
	}
	sr, err := r.OpenFile(name)
	if err != nil {
		return nil, err
	}
	whole := sha256.New()
	var off int64
	for off < e.Size {
		ce, ok := r.ChunkEntryForOffset(name, off)
		if !ok {
			return nil, fmt.Errorf("no chunk at offset %d", off)
		}
		if ce.ChunkOffset != off {
			return nil, fmt.Errorf("chunk at %d starts at %d", off, ce.ChunkOffset)
		}
		buf := make([]byte, ce.ChunkSize)
		if _, err := sr.ReadAt(buf, ce.ChunkOffset); err != nil && err != io.EOF {
			return nil, fmt.Errorf("read chunk at %d: %w", off, err)
		}
		v, err := verifiers.Verifier(ce)
		if err != nil {
			return nil, err
		}
		v.Write(buf)
		if !v.Verified() {
			return nil, fmt.Errorf("chunk at offset %d does not match its digest", off)
		}
		whole.Write(buf)
		d.Chunks++
		off += ce.ChunkSize
	}
	d.SHA256 = hex.EncodeToString(whole.Sum(nil))
	return d, nil
}

func readLines(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines, nil
}

func writeCounted(path string, r io.Reader) (*buildResult, error) {
	out, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(out, h), r)
	if err != nil {
		return nil, err
	}
	return &buildResult{Digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), Size: n}, out.Sync()
}

func digestFile(path string) (*buildResult, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return nil, err
	}
	return &buildResult{Digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), Size: n}, nil
}
