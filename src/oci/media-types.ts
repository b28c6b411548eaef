export const MediaType = {
  OciManifest: 'application/vnd.oci.image.manifest.v1+json',
  OciIndex: 'application/vnd.oci.image.index.v1+json',
  OciConfig: 'application/vnd.oci.image.config.v1+json',
  OciLayerGzip: 'application/vnd.oci.image.layer.v1.tar+gzip',
  OciLayerZstd: 'application/vnd.oci.image.layer.v1.tar+zstd',
  OciLayerTar: 'application/vnd.oci.image.layer.v1.tar',
  DockerManifest: 'application/vnd.docker.distribution.manifest.v2+json',
  DockerManifestList: 'application/vnd.docker.distribution.manifest.list.v2+json',
  DockerConfig: 'application/vnd.docker.container.image.v1+json',
  DockerLayerGzip: 'application/vnd.docker.image.rootfs.diff.tar.gzip',
} as const;

/** What a client that understands every manifest kind sends as Accept. */
export const ALL_MANIFEST_TYPES = [MediaType.OciIndex, MediaType.OciManifest, MediaType.DockerManifestList, MediaType.DockerManifest].join(
  ', ',
);
