/**
 * The item at `index` of a list the caller knows holds one there: a loop bound, a length checked
 * just before, a capture group the pattern always fills. With noUncheckedIndexedAccess an indexed
 * read may be undefined; this says the caller's proof once and, should it be wrong, throws an error
 * that names the index instead of passing undefined on. (Not for lists whose items may be undefined.)
 */
export function itemAt<T>(items: ArrayLike<T>, index: number): T {
  const item = items[index];
  if (item === undefined) throw new RangeError(`no item at index ${index} (length ${items.length})`);
  return item;
}
