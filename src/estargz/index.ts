/** eStargz (seekable tar.gz) layers, compatible with containerd/stargz-snapshotter's estargz v0.12. */
export { buildEstargz, DEFAULT_CHUNK_SIZE, DEFAULT_LEVEL, type BuildOptions, type BuildResult } from './writer.js';
export { openEstargz, EstargzReader } from './reader.js';
export { verifyEstargz } from './verifier.js';
export { fileSource, bufferSource, checkRange, type RangeSource } from './source.js';
export { registryBlobSource } from './registry-source.js';
export { DEFAULT_ZSTD_LEVEL, MAX_ZSTD_LEVEL } from './zstd.js';
export { ZSTD_MANIFEST_CHECKSUM_ANNOTATION, ZSTD_MANIFEST_POSITION_ANNOTATION } from './zstd-footer.js';
export { EstargzError, type EstargzErrorCode } from './errors.js';
export { encodeFooter, parseFooter, parseLegacyFooter, parseAnyFooter, FOOTER_SIZE } from './footer.js';
export {
  serializeToc,
  parseTocJson,
  indexToc,
  PREFETCH_LANDMARK,
  NO_PREFETCH_LANDMARK,
  TOC_DIGEST_ANNOTATION,
  UNCOMPRESSED_SIZE_ANNOTATION,
  type Toc,
  type EstargzEntry,
  type ChunkRef,
} from './toc.js';
