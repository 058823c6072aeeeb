//! An intrusive doubly linked list over block ids: O(1) push, remove and pop.

pub(crate) const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Links {
    prev: u32,
    next: u32,
    linked: bool,
}

/// Least recently used first (`pop_oldest`), most recent at the back.
#[derive(Debug, Clone)]
pub(crate) struct Lru {
    links: Vec<Links>,
    head: u32,
    tail: u32,
    len: usize,
}

impl Lru {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            links: vec![
                Links {
                    prev: NIL,
                    next: NIL,
                    linked: false
                };
                capacity
            ],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn contains(&self, id: u32) -> bool {
        self.links[id as usize].linked
    }

    pub(crate) fn push_back(&mut self, id: u32) {
        debug_assert!(!self.contains(id));
        self.links[id as usize] = Links {
            prev: self.tail,
            next: NIL,
            linked: true,
        };
        match self.tail {
            NIL => self.head = id,
            tail => self.links[tail as usize].next = id,
        }
        self.tail = id;
        self.len += 1;
    }

    pub(crate) fn remove(&mut self, id: u32) {
        let Links { prev, next, linked } = self.links[id as usize];
        debug_assert!(linked);
        match prev {
            NIL => self.head = next,
            prev => self.links[prev as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            next => self.links[next as usize].prev = prev,
        }
        self.links[id as usize] = Links {
            prev: NIL,
            next: NIL,
            linked: false,
        };
        self.len -= 1;
    }

    pub(crate) fn pop_oldest(&mut self) -> Option<u32> {
        let head = self.head;
        (head != NIL).then(|| {
            self.remove(head);
            head
        })
    }

    /// Oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors((self.head != NIL).then_some(self.head), |&id| {
            let next = self.links[id as usize].next;
            (next != NIL).then_some(next)
        })
    }
}
