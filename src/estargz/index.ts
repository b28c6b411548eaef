/** eStargz (seekable tar.gz) layers, compatible with containerd/stargz-snapshotter's estargz v0.12. */
export { buildEstargz, DEFAULT_CHUNK_SIZE, DEFAULT_LEVEL, type BuildOptions, type BuildResult } from './writer.js';
export { openEstargz, EstargzReader, type OpenOptions } from './reader.js';
export { verifyEstargz, type VerifyResult } from './verifier.js';
export { fileSource, bufferSource, checkRange, type RangeSource } from './source.js';
export { registryBlobSource } from './registry-source.js';
export { isZstd, DEFAULT_ZSTD_LEVEL, MAX_ZSTD_LEVEL } from './zstd.js';
export {
  encodeZstdFooter, parseZstdFooter, ZSTD_FOOTER_SIZE, ZSTD_MANIFEST_CHECKSUM_ANNOTATION, ZSTD_MANIFEST_POSITION_ANNOTATION,
} from './zstd-footer.js';
export { EstargzError, type EstargzErrorCode } from './errors.js';
export { encodeFooter, parseFooter, parseLegacyFooter, parseAnyFooter, FOOTER_SIZE, LEGACY_FOOTER_SIZE, type Footer } from './footer.js';
export {
  serializeToc, parseTocJson, indexToc, TOC_TAR_NAME, PREFETCH_LANDMARK, NO_PREFETCH_LANDMARK, TOC_DIGEST_ANNOTATION,
  UNCOMPRESSED_SIZE_ANNOTATION, DEFAULT_MAX_TOC_SIZE, type Toc, type TocEntry, type EstargzEntry, type ChunkRef, type EntryType,
} from './toc.js';
