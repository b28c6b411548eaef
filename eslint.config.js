// ESLint for every area (src, test, bench, sim, console), with typescript-eslint's type-aware rules.
// Each file is checked in the TypeScript project of its area (the nearest tsconfig.json).
import js from '@eslint/js';
import { defineConfig } from 'eslint/config';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default defineConfig(
  {
    ignores: ['dist/', 'console/dist/', 'node_modules/', 'native/', 'test-tools/', 'bench/results/', '.starling/'],
  },
  js.configs.recommended,
  tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: {
        projectService: {
          // Config files outside every area's tsconfig.
          allowDefaultProject: ['eslint.config.js', 'console/vite.config.ts', 'bench/lib/*.mjs', 'scripts/*.mjs'],
        },
        tsconfigRootDir: import.meta.dirname,
      },
    },
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    rules: {
      '@typescript-eslint/no-floating-promises': [
        'error',
        // node:test's test() and describe() return promises the runner itself awaits.
        { allowForKnownSafeCalls: [{ from: 'package', package: 'node:test', name: ['test', 'it', 'describe', 'suite'] }] },
      ],
      '@typescript-eslint/no-misused-promises': 'error',
      // An async function need not await: it still turns a throw into a rejection, which callers
      // of a promise-returning interface rely on.
      '@typescript-eslint/require-await': 'off',
      // Rejecting with an AbortSignal's reason (typed any) is how an aborted operation ends.
      '@typescript-eslint/prefer-promise-reject-errors': ['error', { allowThrowingAny: true }],
      // A `let` that callbacks read before its one assignment (a forward reference) stays a `let`.
      'prefer-const': ['error', { ignoreReadBeforeAssign: true }],
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
    },
  },
  {
    // An index or a lookup the code knows is there says so with a check or itemAt() (common/indexing.ts),
    // which names the index if the proof was wrong, not with `!`; a test checks with assert.ok().
    files: ['src/**/*.ts', 'console/src/**/*.{ts,tsx}', 'sim/**/*.ts', 'bench/**/*.ts', 'test/**/*.ts'],
    rules: { '@typescript-eslint/no-non-null-assertion': 'error' },
  },
  {
    // Plain JavaScript run by Node (the install step, a preload for benchmarks, this file): its values
    // have no declared types, so the checks of untyped values would flag every one.
    files: ['**/*.js', '**/*.mjs'],
    languageOptions: { globals: globals.node },
    rules: {
      '@typescript-eslint/no-unsafe-argument': 'off',
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-call': 'off',
      '@typescript-eslint/no-unsafe-member-access': 'off',
      '@typescript-eslint/no-unsafe-return': 'off',
    },
  },
  {
    // Tests read the JSON and gRPC answers of the real servers they start as `any`, and their
    // assertions check the shapes; typing every such read would add casts, not checks.
    files: ['test/**'],
    rules: {
      '@typescript-eslint/no-unsafe-argument': 'off',
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-call': 'off',
      '@typescript-eslint/no-unsafe-member-access': 'off',
      '@typescript-eslint/no-unsafe-return': 'off',
      '@typescript-eslint/no-explicit-any': 'off',
    },
  },
);
