import type { Platform } from './platform.js';

export interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
  annotations?: Record<string, string>;
  platform?: Partial<Platform> & { 'os.version'?: string; 'os.features'?: string[] };
  urls?: string[];
}

export interface ImageManifest {
  schemaVersion: 2;
  mediaType?: string;
  config: Descriptor;
  layers: Descriptor[];
  annotations?: Record<string, string>;
}

export interface ImageIndex {
  schemaVersion: 2;
  mediaType?: string;
  manifests: Descriptor[];
  annotations?: Record<string, string>;
}

export interface ImageConfig {
  os?: string;
  architecture?: string;
  variant?: string;
  rootfs?: { type: string; diff_ids: string[] };
  [key: string]: unknown;
}
