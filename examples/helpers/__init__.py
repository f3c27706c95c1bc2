"""Code that several chapters' mains and tests share. Each module belongs to the chapter that
introduces it (its manifest's `helpers`) and is in the trees of that chapter and the later ones:
a main never imports another chapter's main."""
