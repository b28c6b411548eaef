import { defineConfig } from 'vite';

// Built by the root `npm run build` (vite build console) into console/dist, which the manager
// serves at /. For development, `npm run console:dev` proxies the API to a manager on
// 127.0.0.1:8080 (or STARLING_MANAGER_URL).
export default defineConfig({
  base: '/',
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    rolldownOptions: {
      onwarn(warning, warn) {
        // react-query marks its modules "use client" for server components; meaningless in this bundle.
        if (warning.code === 'MODULE_LEVEL_DIRECTIVE') return;
        warn(warning);
      },
    },
  },
  server: {
    proxy: { '/api': process.env.STARLING_MANAGER_URL ?? 'http://127.0.0.1:8080' },
  },
});
